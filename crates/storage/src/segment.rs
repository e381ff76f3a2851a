//! Segment files: one reduced batch each, immutable once written.
//!
//! ```text
//! header  (32 B)  "CHSG" | format u16 | flags u16 | first index u64 | last index u64
//!                 | record count u32 | crc32 of the preceding 28 bytes
//! records         crc32 of the rest of the record | kind u8 (1 put, 2 tombstone) | version u64
//!                 | key length u32 | value length u32 | key | value
//! index           per record, in key order: kind u8 | version u64 | record offset u64
//!                 | key length u32 | value length u32 | key
//! footer  (28 B)  index offset u64 | index length u64 | record count u32 | crc32 of the index
//!                 | "CHSF"
//! ```
//!
//! Records and index entries are in key order, one per key; with header flag 1 (`log order`, the
//! `full` storage mode's unreduced batches) they are in log order instead, keys repeating.
//! All integers are little-endian. A record's version is the log index of the write it keeps.
//! Start-up reads the header, the footer and the index, never the values; a value is read with one
//! positioned read of its record, whose checksum is verified.

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::reduce::ReducedBatch;

pub const HEADER_BYTES: usize = 32;
pub const FOOTER_BYTES: usize = 28;
const RECORD_OVERHEAD_BYTES: usize = 4 + 1 + 8 + 4 + 4;
const INDEX_ENTRY_OVERHEAD_BYTES: usize = 1 + 8 + 8 + 4 + 4;
const HEADER_MAGIC: &[u8; 4] = b"CHSG";
const FOOTER_MAGIC: &[u8; 4] = b"CHSF";
const FORMAT_VERSION: u16 = 1;
const KIND_PUT: u8 = 1;
const KIND_TOMBSTONE: u8 = 2;
const FLAG_LOG_ORDER: u16 = 1;

/// The latest write of one key in a batch: a value, or a tombstone (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Bytes,
    pub value: Option<Bytes>,
    /// Log index of the write.
    pub version: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub first_index: u64,
    pub last_index: u64,
    pub record_count: u32,
    /// Records in log order, keys repeating (an unreduced batch), rather than one per key.
    pub log_order: bool,
}

/// Where one key's record sits in its segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub key: Bytes,
    pub version: u64,
    pub is_tombstone: bool,
    pub record_offset: u64,
    pub value_len: u32,
}

impl IndexEntry {
    /// Bytes of the whole record on disk.
    pub fn record_len(&self) -> usize {
        record_len(self.key.len(), self.value_len)
    }

    /// Bytes the record and this entry take in a segment: what keeping the record costs a merge.
    pub fn segment_bytes(&self) -> usize {
        segment_bytes_per_record(self.key.len(), self.value_len)
    }
}

/// Bytes on disk of a record with a key and a value of these lengths.
pub fn record_len(key_len: usize, value_len: u32) -> usize {
    RECORD_OVERHEAD_BYTES + key_len + value_len as usize
}

/// Bytes a record with a key and a value of these lengths adds to a segment: the record and its
/// index entry.
pub fn segment_bytes_per_record(key_len: usize, value_len: u32) -> usize {
    record_len(key_len, value_len) + INDEX_ENTRY_OVERHEAD_BYTES + key_len
}

/// What start-up learns about a segment without reading its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentIndex {
    pub header: SegmentHeader,
    pub entries: Vec<IndexEntry>,
    pub file_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("corrupt segment at byte {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    InFile { path: PathBuf, source: Box<SegmentError> },
}

impl SegmentError {
    /// Whether the file system is full (or the user's quota spent): a write may succeed later.
    pub fn is_out_of_space(&self) -> bool {
        match self {
            SegmentError::Io { source, .. } => matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)),
            SegmentError::InFile { source, .. } => source.is_out_of_space(),
            SegmentError::Corrupt { .. } => false,
        }
    }
}

/// Starts a framed buffer: `magic | format u16 | …`, closed by `seal_frame`.
pub(crate) fn start_frame(magic: &[u8; 4], format: u16, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity + 10);
    out.extend_from_slice(magic);
    out.extend_from_slice(&format.to_le_bytes());
    out
}

/// Ends a framed buffer with the crc32 of everything before.
pub(crate) fn seal_frame(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Checks a framed buffer's length (at least `min_content` bytes of content), magic, checksum
/// and format, and returns its content: the bytes between the format and the checksum, which
/// start at offset `FRAME_HEADER_BYTES` of `buf`.
pub(crate) fn open_frame<'a>(
    buf: &'a [u8],
    magic: &[u8; 4],
    format: u16,
    min_content: usize,
    what: &str,
) -> Result<&'a [u8], SegmentError> {
    if buf.len() < FRAME_HEADER_BYTES + min_content + 4 {
        return Err(corrupt(buf.len(), format!("{what} shorter than its fixed fields")));
    }
    if &buf[..4] != magic {
        return Err(corrupt(0, format!("not {what} (bad magic)")));
    }
    let (body, crc) = buf.split_at(buf.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(corrupt(body.len(), format!("{what} checksum mismatch")));
    }
    let found = u16::from_le_bytes(buf[4..6].try_into().expect("2 bytes"));
    if found != format {
        return Err(corrupt(4, format!("unknown format {found} of {what}")));
    }
    Ok(&body[FRAME_HEADER_BYTES..])
}

/// Magic and format before a framed buffer's content.
pub(crate) const FRAME_HEADER_BYTES: usize = 6;

pub(crate) fn corrupt(offset: usize, reason: impl Into<String>) -> SegmentError {
    SegmentError::Corrupt {
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Reads little-endian fields from a slice, reporting where it ran out.
struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` in the file, for error messages.
    base: usize,
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8], base: usize) -> Self {
        Fields { buf, pos: 0, base }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], SegmentError> {
        if self.buf.len() - self.pos < n {
            return Err(corrupt(self.base + self.pos, format!("truncated {what}")));
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }
    fn u8(&mut self, what: &str) -> Result<u8, SegmentError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, SegmentError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2 bytes")))
    }
    fn u32(&mut self, what: &str) -> Result<u32, SegmentError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self, what: &str) -> Result<u64, SegmentError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    fn offset(&self) -> usize {
        self.base + self.pos
    }
}

/// `"{first:020}-{last:020}.seg"`: names sort in log order.
pub fn segment_file_name(first_index: u64, last_index: u64) -> String {
    format!("{first_index:020}-{last_index:020}.seg")
}

/// The bytes of a segment holding `batch`.
pub fn encode_segment(batch: &ReducedBatch) -> Vec<u8> {
    encode_segment_and_index(batch).0
}

/// The bytes of a segment holding `batch`, and the index they contain (its keys shared with the
/// batch's, not copied).
pub fn encode_segment_and_index(batch: &ReducedBatch) -> (Vec<u8>, SegmentIndex) {
    assert!(
        batch.first_index <= batch.last_index,
        "a batch covers at least one index"
    );
    let record_count = u32::try_from(batch.records.len()).expect("fewer than 2^32 records in a batch");
    let payload: usize = batch
        .records
        .iter()
        .map(|r| {
            RECORD_OVERHEAD_BYTES
                + INDEX_ENTRY_OVERHEAD_BYTES
                + 2 * r.key.len()
                + r.value.as_ref().map_or(0, Bytes::len)
        })
        .sum();
    let mut out = Vec::with_capacity(HEADER_BYTES + payload + FOOTER_BYTES);
    out.extend_from_slice(HEADER_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let flags = if batch.log_order { FLAG_LOG_ORDER } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&batch.first_index.to_le_bytes());
    out.extend_from_slice(&batch.last_index.to_le_bytes());
    out.extend_from_slice(&record_count.to_le_bytes());
    let header_crc = crc32fast::hash(&out);
    out.extend_from_slice(&header_crc.to_le_bytes());

    let mut offsets = Vec::with_capacity(batch.records.len());
    for (i, record) in batch.records.iter().enumerate() {
        assert!(
            (batch.first_index..=batch.last_index).contains(&record.version),
            "a record's version lies in its batch"
        );
        assert!(
            i == 0
                || if batch.log_order {
                    batch.records[i - 1].version <= record.version
                } else {
                    batch.records[i - 1].key < record.key
                },
            "records are sorted by key, one per key, or in log order"
        );
        offsets.push(out.len() as u64);
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        let value = record.value.as_deref().unwrap_or_default();
        out.push(if record.value.is_some() {
            KIND_PUT
        } else {
            KIND_TOMBSTONE
        });
        out.extend_from_slice(&record.version.to_le_bytes());
        out.extend_from_slice(&(record.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(&record.key);
        out.extend_from_slice(value);
        let crc = crc32fast::hash(&out[start + 4..]);
        out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    }

    let index_offset = out.len();
    let mut entries = Vec::with_capacity(batch.records.len());
    for (record, offset) in batch.records.iter().zip(offsets) {
        entries.push(IndexEntry {
            key: record.key.clone(),
            version: record.version,
            is_tombstone: record.value.is_none(),
            record_offset: offset,
            value_len: record.value.as_ref().map_or(0, Bytes::len) as u32,
        });
        out.push(if record.value.is_some() {
            KIND_PUT
        } else {
            KIND_TOMBSTONE
        });
        out.extend_from_slice(&record.version.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(record.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&(record.value.as_ref().map_or(0, Bytes::len) as u32).to_le_bytes());
        out.extend_from_slice(&record.key);
    }
    let index_crc = crc32fast::hash(&out[index_offset..]);
    let index_len = (out.len() - index_offset) as u64;
    out.extend_from_slice(&(index_offset as u64).to_le_bytes());
    out.extend_from_slice(&index_len.to_le_bytes());
    out.extend_from_slice(&record_count.to_le_bytes());
    out.extend_from_slice(&index_crc.to_le_bytes());
    out.extend_from_slice(FOOTER_MAGIC);
    let index = SegmentIndex {
        header: SegmentHeader {
            first_index: batch.first_index,
            last_index: batch.last_index,
            record_count,
            log_order: batch.log_order,
        },
        entries,
        file_bytes: out.len() as u64,
    };
    (out, index)
}

/// Decodes the first `HEADER_BYTES` of a segment.
pub fn decode_header(buf: &[u8]) -> Result<SegmentHeader, SegmentError> {
    let mut f = Fields::new(buf, 0);
    if f.take(4, "header")? != HEADER_MAGIC {
        return Err(corrupt(0, "not a segment (bad header magic)"));
    }
    let format = f.u16("header")?;
    if format != FORMAT_VERSION {
        return Err(corrupt(
            4,
            format!("segment format {format}, this build reads {FORMAT_VERSION}"),
        ));
    }
    let flags = f.u16("header")?;
    let header = SegmentHeader {
        first_index: f.u64("header")?,
        last_index: f.u64("header")?,
        record_count: f.u32("header")?,
        log_order: flags & FLAG_LOG_ORDER != 0,
    };
    let crc_at = f.offset();
    let crc = f.u32("header")?;
    if crc != crc32fast::hash(&buf[..crc_at]) {
        return Err(corrupt(crc_at, "header checksum mismatch"));
    }
    if flags & !FLAG_LOG_ORDER != 0 {
        return Err(corrupt(6, format!("unknown header flags {flags:#x}")));
    }
    if header.first_index > header.last_index {
        return Err(corrupt(8, "first index after last index"));
    }
    Ok(header)
}

/// Decodes the last `FOOTER_BYTES` of a segment of `file_bytes` bytes: (index offset, index
/// length, record count, index checksum), with the index's extent checked against the file.
pub fn decode_footer(buf: &[u8], file_bytes: u64) -> Result<(u64, u64, u32, u32), SegmentError> {
    let Some(index_end) = file_bytes.checked_sub(FOOTER_BYTES as u64) else {
        return Err(corrupt(0, "shorter than a footer"));
    };
    let base = index_end as usize;
    let mut f = Fields::new(buf, base);
    let index_offset = f.u64("footer")?;
    let index_len = f.u64("footer")?;
    let record_count = f.u32("footer")?;
    let index_crc = f.u32("footer")?;
    if f.take(4, "footer")? != FOOTER_MAGIC {
        return Err(corrupt(base, "no footer (a segment write that did not finish?)"));
    }
    if index_offset < HEADER_BYTES as u64 || index_offset.checked_add(index_len) != Some(index_end) {
        return Err(corrupt(base, "index extent does not fit the file"));
    }
    Ok((index_offset, index_len, record_count, index_crc))
}

/// Decodes a segment's index block, which starts at `index_offset` and ends where the records
/// it points to may not reach.
pub fn decode_index(
    buf: &[u8],
    index_offset: u64,
    header: &SegmentHeader,
    index_crc: u32,
) -> Result<Vec<IndexEntry>, SegmentError> {
    let base = index_offset as usize;
    if crc32fast::hash(buf) != index_crc {
        return Err(corrupt(base, "index checksum mismatch"));
    }
    let mut f = Fields::new(buf, base);
    let mut entries = Vec::with_capacity((header.record_count as usize).min(buf.len() / INDEX_ENTRY_OVERHEAD_BYTES));
    let mut record_end = HEADER_BYTES as u64;
    let mut this_entry_keys = foldhash::HashSet::default();
    for _ in 0..header.record_count {
        let at = f.offset();
        let kind = f.u8("index entry")?;
        let version = f.u64("index entry")?;
        let record_offset = f.u64("index entry")?;
        let key_len = f.u32("index entry")? as usize;
        let value_len = f.u32("index entry")?;
        let key_slice = f.take(key_len, "index key")?;
        let key = Bytes::copy_from_slice(key_slice);
        let is_tombstone = match (kind, value_len) {
            (KIND_PUT, _) => false,
            (KIND_TOMBSTONE, 0) => true,
            (KIND_TOMBSTONE, _) => return Err(corrupt(at, "a tombstone with a value")),
            (other, _) => return Err(corrupt(at, format!("unknown record kind {other}"))),
        };
        if !(header.first_index..=header.last_index).contains(&version) {
            return Err(corrupt(at, format!("version {version} outside the segment's range")));
        }
        if header.log_order {
            // One entry's writes to a key are recorded once, as their result.
            if entries.last().is_some_and(|last: &IndexEntry| last.version != version) {
                this_entry_keys.clear();
            }
            if entries.last().is_some_and(|last: &IndexEntry| last.version > version) {
                return Err(corrupt(at, "index versions out of log order"));
            }
            if !this_entry_keys.insert(key_slice) {
                return Err(corrupt(at, "a key recorded twice for one log entry"));
            }
        } else if entries.last().is_some_and(|last: &IndexEntry| last.key >= key) {
            return Err(corrupt(at, "index keys out of order"));
        }
        let entry = IndexEntry {
            key,
            version,
            is_tombstone,
            record_offset,
            value_len,
        };
        // Records are laid out in index order, back to back, before the index.
        if record_offset != record_end {
            return Err(corrupt(
                at,
                format!("record offset {record_offset}, expected {record_end}"),
            ));
        }
        record_end = record_offset.saturating_add(entry.record_len() as u64);
        if record_end > index_offset {
            return Err(corrupt(at, "record runs into the index"));
        }
        entries.push(entry);
    }
    if record_end != index_offset || f.pos != buf.len() {
        return Err(corrupt(f.offset(), "index does not account for the whole segment"));
    }
    Ok(entries)
}

/// Checks the record that starts `buf` (read from `record_offset`) against its index entry and
/// returns where in `buf` its key and (for a put) its value are.
fn check_record(buf: &[u8], entry: &IndexEntry) -> Result<(Range<usize>, Option<Range<usize>>), SegmentError> {
    let base = entry.record_offset as usize;
    let mut f = Fields::new(buf, base);
    let crc = f.u32("record")?;
    let body = &buf[4..buf.len().min(entry.record_len())];
    if body.len() + 4 != entry.record_len() {
        return Err(corrupt(base, "truncated record"));
    }
    if crc32fast::hash(body) != crc {
        return Err(corrupt(base, "record checksum mismatch"));
    }
    let kind = f.u8("record")?;
    let version = f.u64("record")?;
    let key_len = f.u32("record")? as usize;
    let value_len = f.u32("record")?;
    let key_start = f.pos;
    let key = f.take(key_len, "record key")?;
    let value_start = f.pos;
    f.take(value_len as usize, "record value")?;
    let is_tombstone = match kind {
        KIND_PUT => false,
        KIND_TOMBSTONE => true,
        other => return Err(corrupt(base, format!("unknown record kind {other}"))),
    };
    if version != entry.version
        || key != entry.key
        || value_len != entry.value_len
        || is_tombstone != entry.is_tombstone
    {
        return Err(corrupt(base, "record does not match its index entry"));
    }
    let value = (!is_tombstone).then(|| value_start..value_start + value_len as usize);
    Ok((key_start..key_start + key_len, value))
}

/// Decodes the record that starts `buf` (read from `record_offset`) and checks it against its
/// index entry.
pub fn decode_record(buf: &[u8], entry: &IndexEntry) -> Result<Record, SegmentError> {
    let (_, value) = check_record(buf, entry)?;
    Ok(Record {
        key: entry.key.clone(),
        value: value.map(|range| Bytes::copy_from_slice(&buf[range])),
        version: entry.version,
    })
}

/// Decodes and verifies a whole segment held in memory: header, footer, index and every record.
pub fn decode_segment(buf: &[u8]) -> Result<(SegmentHeader, Vec<Record>), SegmentError> {
    let index = decode_segment_index(buf)?;
    let records = index
        .entries
        .iter()
        .map(|entry| decode_record(&buf[entry.record_offset as usize..], entry))
        .collect::<Result<_, _>>()?;
    Ok((index.header, records))
}

fn decode_segment_index(buf: &[u8]) -> Result<SegmentIndex, SegmentError> {
    load_index(buf.len() as u64, |offset, len| {
        Ok(Cow::Borrowed(&buf[offset as usize..offset as usize + len]))
    })
}

/// Decodes header, footer and index of a segment of `file_bytes` bytes, fetching each part with
/// `read(offset, len)`, which is only asked for ranges inside the file.
fn load_index<'a>(
    file_bytes: u64,
    mut read: impl FnMut(u64, usize) -> Result<Cow<'a, [u8]>, SegmentError>,
) -> Result<SegmentIndex, SegmentError> {
    if file_bytes < (HEADER_BYTES + FOOTER_BYTES) as u64 {
        return Err(corrupt(file_bytes as usize, "shorter than a header and a footer"));
    }
    let header = decode_header(&read(0, HEADER_BYTES)?)?;
    let footer_offset = file_bytes - FOOTER_BYTES as u64;
    let (index_offset, index_len, record_count, index_crc) =
        decode_footer(&read(footer_offset, FOOTER_BYTES)?, file_bytes)?;
    if header.record_count != record_count {
        return Err(corrupt(
            footer_offset as usize,
            "header and footer disagree on the record count",
        ));
    }
    let index = read(index_offset, index_len as usize)?;
    let entries = decode_index(&index, index_offset, &header, index_crc)?;
    Ok(SegmentIndex {
        header,
        entries,
        file_bytes,
    })
}

/// Names the file a corruption was found in (an I/O error names it already).
pub(crate) fn in_file(path: &Path) -> impl FnOnce(SegmentError) -> SegmentError + '_ {
    move |error| match error {
        SegmentError::Corrupt { .. } => SegmentError::InFile {
            path: path.to_path_buf(),
            source: Box::new(error),
        },
        other => other,
    }
}

pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `batch` as a segment in `dir` (see `write_segment_bytes`) and returns its path and index.
/// `spare`, a file in `dir` that no manifest lists any more, is overwritten instead of creating a
/// file: on ext4 without a journal, creating an inode scans past every inode deleted in the last
/// minutes, which a cleaner deleting segments keeps plentiful.
pub fn write_segment(
    dir: &Path,
    batch: &ReducedBatch,
    spare: Option<PathBuf>,
) -> Result<(PathBuf, SegmentIndex), SegmentError> {
    let (bytes, index) = encode_segment_and_index(batch);
    debug_assert_eq!(
        decode_segment_index(&bytes).expect("a segment just encoded decodes"),
        index,
        "a segment decodes to what was encoded"
    );
    let path = write_segment_bytes(dir, batch.first_index, batch.last_index, &bytes, spare)?;
    Ok((path, index))
}

/// Writes a segment's bytes to a temporary file with one write and renames it into place, so
/// the name never shows a partial segment while the machine runs. Nothing is synced: the raft
/// log holds what the segment holds until a manifest lists it, and a manifest lists only
/// segments whose files and directory were synced. A segment already there is replaced: a
/// segment's content is fixed by its range of the committed log, so both copies are equal.
/// A spare file is renamed to the temporary name and overwritten, then cut to length (not
/// truncated to zero first: ext4 flushes a file truncated to zero and rewritten when it closes).
fn write_segment_bytes(
    dir: &Path,
    first_index: u64,
    last_index: u64,
    bytes: &[u8],
    spare: Option<PathBuf>,
) -> Result<PathBuf, SegmentError> {
    let path = dir.join(segment_file_name(first_index, last_index));
    let temporary = path.with_extension("seg.tmp");
    let reused = spare.is_some_and(|spare| std::fs::rename(&spare, &temporary).is_ok());
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(!reused)
        .mode(0o644)
        .open(&temporary)
        .map_err(io_error(&temporary))?;
    file.write_all(bytes).map_err(io_error(&temporary))?;
    if reused {
        file.set_len(bytes.len() as u64).map_err(io_error(&temporary))?;
    }
    std::fs::rename(&temporary, &path).map_err(io_error(&path))?;
    Ok(path)
}

/// The name of the `number`th spare file: a retired segment's file kept to be overwritten by a
/// later segment. Start-up deletes spares.
pub(crate) fn spare_file_name(number: u64) -> String {
    format!("{number:020}.spare")
}

/// Makes creations, renames and removals in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), SegmentError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(dir))
}

/// Verifies every part of a segment held in memory and returns its index.
pub fn verify_segment(buf: &[u8]) -> Result<SegmentIndex, SegmentError> {
    let index = decode_segment_index(buf)?;
    for entry in &index.entries {
        decode_record(&buf[entry.record_offset as usize..], entry)?;
    }
    Ok(index)
}

/// Reads a segment's header, footer and index — not its values — with positioned reads.
pub fn read_segment_index(path: &Path) -> Result<SegmentIndex, SegmentError> {
    let file = File::open(path).map_err(io_error(path))?;
    let file_bytes = file.metadata().map_err(io_error(path))?.len();
    load_index(file_bytes, |offset, len| {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, offset).map_err(io_error(path))?;
        Ok(Cow::Owned(buf))
    })
    .map_err(in_file(path))
}

/// Reads and verifies a whole segment file. Keys and values share the one buffer read.
pub fn read_segment(path: &Path) -> Result<(SegmentHeader, Vec<Record>), SegmentError> {
    let bytes = Bytes::from(std::fs::read(path).map_err(io_error(path))?);
    let decode = || {
        let index = decode_segment_index(&bytes)?;
        let mut records = Vec::with_capacity(index.entries.len());
        for entry in &index.entries {
            let start = entry.record_offset as usize;
            let (key, value) = check_record(&bytes[start..], entry)?;
            let record_bytes = bytes.slice(start..);
            records.push(Record {
                key: record_bytes.slice(key),
                value: value.map(|range| record_bytes.slice(range)),
                version: entry.version,
            });
        }
        Ok((index.header, records))
    };
    decode().map_err(in_file(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::Reducer;

    fn sample_writes(mut r: Reducer) -> ReducedBatch {
        r.write(100, "user:1".into(), Some("alice".into()));
        r.write(101, "user:2".into(), Some(Bytes::from(vec![7u8; 300])));
        r.write(102, "user:1".into(), Some("alice2".into()));
        r.write(103, "gone".into(), None);
        r.note_index(104);
        r.take().unwrap()
    }

    fn sample_batch() -> ReducedBatch {
        sample_writes(Reducer::new())
    }

    /// The same writes unreduced, as the `full` storage mode persists them.
    fn sample_log_order_batch() -> ReducedBatch {
        sample_writes(Reducer::keeping_every_write(99))
    }

    #[test]
    fn a_log_order_segment_keeps_every_write_and_refuses_a_key_twice_in_one_entry() {
        let batch = sample_log_order_batch();
        let bytes = encode_segment(&batch);
        let (header, records) = decode_segment(&bytes).unwrap();
        assert!(header.log_order);
        assert_eq!(records, batch.records);
        assert_eq!(records.len(), 4, "user:1 twice, the delete as a tombstone");

        let mut twice = batch.clone();
        twice.records[1].key = "user:1".into();
        twice.records[1].version = 100;
        let message = decode_segment(&encode_segment(&twice)).unwrap_err().to_string();
        assert!(message.contains("a key recorded twice for one log entry"), "{message}");
    }

    #[test]
    fn a_segment_written_over_a_longer_spare_is_exactly_itself() {
        let dir = tempfile::tempdir().unwrap();
        let spare = dir.path().join(spare_file_name(7));
        std::fs::write(&spare, vec![0xAB; 64 * 1024]).unwrap();
        let batch = sample_batch();
        let (path, index) = write_segment(dir.path(), &batch, Some(spare.clone())).unwrap();
        assert!(!spare.exists(), "the spare became the segment");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            encode_segment(&batch).len() as u64
        );
        assert_eq!(read_segment(&path).unwrap().1, batch.records);
        assert_eq!(read_segment_index(&path).unwrap(), index);
        // A spare that vanished meanwhile: the segment is created instead.
        let (path, _) = write_segment(dir.path(), &sample_log_order_batch(), Some(spare)).unwrap();
        assert_eq!(read_segment(&path).unwrap().1, sample_log_order_batch().records);
    }

    #[test]
    fn a_written_segment_reads_back_whole_and_by_index() {
        let dir = tempfile::tempdir().unwrap();
        let batch = sample_batch();
        let (path, index) = write_segment(dir.path(), &batch, None).unwrap();
        assert_eq!(
            path.file_name().unwrap(),
            "00000000000000000100-00000000000000000104.seg"
        );
        let (header, records) = read_segment(&path).unwrap();
        assert_eq!(
            header,
            SegmentHeader {
                first_index: 100,
                last_index: 104,
                record_count: 3,
                log_order: false,
            }
        );
        assert_eq!(records, batch.records);
        let from_disk = read_segment_index(&path).unwrap();
        assert_eq!(from_disk, index);
        let file = File::open(&path).unwrap();
        for (entry, expected) in from_disk.entries.iter().zip(&batch.records) {
            let mut buf = vec![0; entry.record_len()];
            file.read_exact_at(&mut buf, entry.record_offset).unwrap();
            assert_eq!(&decode_record(&buf, entry).unwrap(), expected);
        }
        let (again, _) = write_segment(dir.path(), &batch, None).unwrap();
        assert_eq!(
            std::fs::read(&again).unwrap(),
            encode_segment(&batch),
            "rewriting a range is idempotent"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind: {names:?}");
    }

    #[test]
    fn every_flipped_bit_and_every_truncation_is_detected() {
        for batch in [sample_batch(), sample_log_order_batch()] {
            assert_every_flip_and_truncation_detected(&encode_segment(&batch));
        }
    }

    fn assert_every_flip_and_truncation_detected(bytes: &[u8]) {
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.to_vec();
                bad[at] ^= 1 << bit;
                assert!(
                    decode_segment(&bad).is_err(),
                    "flip of bit {bit} at byte {at} went unnoticed"
                );
            }
        }
        for len in 0..bytes.len() {
            assert!(
                decode_segment(&bytes[..len]).is_err(),
                "truncation to {len} bytes went unnoticed"
            );
        }
    }

    #[test]
    fn errors_name_the_file_and_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let (path, index) = write_segment(dir.path(), &sample_batch(), None).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let victim = index.entries[1].record_offset as usize;
        bytes[victim + RECORD_OVERHEAD_BYTES] ^= 0x20;
        std::fs::write(&path, &bytes).unwrap();
        let message = read_segment(&path).unwrap_err().to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(
            message.contains(&format!("at byte {victim}: record checksum mismatch")),
            "{message}"
        );
        // The index alone is intact: start-up would load it, and the read of that value fails.
        assert!(read_segment_index(&path).is_ok());
    }

    #[test]
    fn an_empty_batch_of_reads_is_a_valid_segment() {
        let mut r = Reducer::new();
        r.note_index(5);
        let (header, records) = decode_segment(&encode_segment(&r.take().unwrap())).unwrap();
        assert_eq!((header.first_index, header.last_index, records.len()), (5, 5, 0));
    }
}
