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
pub(crate) const RECORD_OVERHEAD_BYTES: usize = 4 + 1 + 8 + 4 + 4;
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
    out.extend_from_slice(&encode_header(&SegmentHeader {
        first_index: batch.first_index,
        last_index: batch.last_index,
        record_count,
        log_order: batch.log_order,
    }));

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
        encode_record(&mut out, record);
    }

    let index_offset = out.len();
    let mut entries = Vec::with_capacity(batch.records.len());
    for (record, offset) in batch.records.iter().zip(offsets) {
        let entry = IndexEntry {
            key: record.key.clone(),
            version: record.version,
            is_tombstone: record.value.is_none(),
            record_offset: offset,
            value_len: record.value.as_ref().map_or(0, Bytes::len) as u32,
        };
        encode_index_entry(&mut out, &entry);
        entries.push(entry);
    }
    let index_crc = crc32fast::hash(&out[index_offset..]);
    let index_len = (out.len() - index_offset) as u64;
    out.extend_from_slice(&encode_footer(index_offset as u64, index_len, record_count, index_crc));
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

fn encode_header(header: &SegmentHeader) -> [u8; HEADER_BYTES] {
    let mut out = [0; HEADER_BYTES];
    out[..4].copy_from_slice(HEADER_MAGIC);
    out[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    let flags = if header.log_order { FLAG_LOG_ORDER } else { 0 };
    out[6..8].copy_from_slice(&flags.to_le_bytes());
    out[8..16].copy_from_slice(&header.first_index.to_le_bytes());
    out[16..24].copy_from_slice(&header.last_index.to_le_bytes());
    out[24..28].copy_from_slice(&header.record_count.to_le_bytes());
    let crc = crc32fast::hash(&out[..28]);
    out[28..].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Appends `record` as it is laid out in a segment.
fn encode_record(out: &mut Vec<u8>, record: &Record) {
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

fn encode_index_entry(out: &mut Vec<u8>, entry: &IndexEntry) {
    out.push(if entry.is_tombstone { KIND_TOMBSTONE } else { KIND_PUT });
    out.extend_from_slice(&entry.version.to_le_bytes());
    out.extend_from_slice(&entry.record_offset.to_le_bytes());
    out.extend_from_slice(&(entry.key.len() as u32).to_le_bytes());
    out.extend_from_slice(&entry.value_len.to_le_bytes());
    out.extend_from_slice(&entry.key);
}

fn encode_footer(index_offset: u64, index_len: u64, record_count: u32, index_crc: u32) -> [u8; FOOTER_BYTES] {
    let mut out = [0; FOOTER_BYTES];
    out[..8].copy_from_slice(&index_offset.to_le_bytes());
    out[8..16].copy_from_slice(&index_len.to_le_bytes());
    out[16..20].copy_from_slice(&record_count.to_le_bytes());
    out[20..24].copy_from_slice(&index_crc.to_le_bytes());
    out[24..].copy_from_slice(FOOTER_MAGIC);
    out
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
/// it points to may not reach. The entries' keys are slices of `buf`: one buffer for the block
/// rather than an allocation per key, which start-up would spend most of its time on.
pub fn decode_index(
    buf: &Bytes,
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
        let key_start = f.pos;
        let key_slice = f.take(key_len, "index key")?;
        let key = buf.slice(key_start..key_start + key_len);
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

/// A record's fields, found at the start of a buffer.
struct RecordFields {
    is_tombstone: bool,
    version: u64,
    key: Range<usize>,
    value: Option<Range<usize>>,
    len: usize,
}

/// Decodes the record that starts `buf` (read from file offset `base`) and verifies its
/// checksum.
fn decode_record_fields(buf: &[u8], base: usize) -> Result<RecordFields, SegmentError> {
    let mut f = Fields::new(buf, base);
    let crc = f.u32("record")?;
    let kind = f.u8("record")?;
    let version = f.u64("record")?;
    let key_len = f.u32("record")? as usize;
    let value_len = f.u32("record")? as usize;
    let len = RECORD_OVERHEAD_BYTES + key_len + value_len;
    if buf.len() < len {
        return Err(corrupt(base, "truncated record"));
    }
    if crc32fast::hash(&buf[4..len]) != crc {
        return Err(corrupt(base, "record checksum mismatch"));
    }
    let is_tombstone = match (kind, value_len) {
        (KIND_PUT, _) => false,
        (KIND_TOMBSTONE, 0) => true,
        (KIND_TOMBSTONE, _) => return Err(corrupt(base, "a tombstone with a value")),
        (other, _) => return Err(corrupt(base, format!("unknown record kind {other}"))),
    };
    let key = RECORD_OVERHEAD_BYTES..RECORD_OVERHEAD_BYTES + key_len;
    let value = (!is_tombstone).then_some(key.end..len);
    Ok(RecordFields {
        is_tombstone,
        version,
        key,
        value,
        len,
    })
}

/// Checks the record that starts `buf` (read from `record_offset`) against its index entry and
/// returns where in `buf` its key and (for a put) its value are.
fn check_record(buf: &[u8], entry: &IndexEntry) -> Result<(Range<usize>, Option<Range<usize>>), SegmentError> {
    let base = entry.record_offset as usize;
    let fields = decode_record_fields(buf, base)?;
    if fields.version != entry.version
        || buf[fields.key.clone()] != entry.key
        || fields.len != entry.record_len()
        || fields.is_tombstone != entry.is_tombstone
    {
        return Err(corrupt(base, "record does not match its index entry"));
    }
    Ok((fields.key, fields.value))
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
    let index = Bytes::from(read(index_offset, index_len as usize)?.into_owned());
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
    let mut temporary = Temporary::create(dir, first_index, last_index, spare)?;
    temporary
        .file
        .write_all(bytes)
        .map_err(io_error(&temporary.temporary))?;
    temporary.put_in_place(bytes.len() as u64)
}

/// A segment being written under a temporary name (see `write_segment_bytes`).
struct Temporary {
    file: File,
    temporary: PathBuf,
    path: PathBuf,
    reused: bool,
}

impl Temporary {
    fn create(
        dir: &Path,
        first_index: u64,
        last_index: u64,
        spare: Option<PathBuf>,
    ) -> Result<Temporary, SegmentError> {
        let path = dir.join(segment_file_name(first_index, last_index));
        let temporary = path.with_extension("seg.tmp");
        let reused = spare.is_some_and(|spare| std::fs::rename(&spare, &temporary).is_ok());
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(!reused)
            .mode(0o644)
            .open(&temporary)
            .map_err(io_error(&temporary))?;
        Ok(Temporary {
            file,
            temporary,
            path,
            reused,
        })
    }

    /// Cuts a reused spare to the `len` bytes written and renames the file into place.
    fn put_in_place(self, len: u64) -> Result<PathBuf, SegmentError> {
        if self.reused {
            self.file.set_len(len).map_err(io_error(&self.temporary))?;
        }
        std::fs::rename(&self.temporary, &self.path).map_err(io_error(&self.path))?;
        Ok(self.path)
    }
}

/// Writes a segment record by record, in key order, in memory bounded by its buffer and the
/// index entries (keys copied) it returns: what a merge writes, however large.
pub struct SegmentWriter {
    out: std::io::BufWriter<File>,
    temporary: Temporary,
    first_index: u64,
    last_index: u64,
    offset: u64,
    entries: Vec<IndexEntry>,
    scratch: Vec<u8>,
}

impl SegmentWriter {
    /// Starts the segment of `[first_index, last_index]` in `dir`, overwriting `spare` if given
    /// (see `write_segment`).
    pub fn create(
        dir: &Path,
        first_index: u64,
        last_index: u64,
        spare: Option<PathBuf>,
        buffer_bytes: usize,
    ) -> Result<SegmentWriter, SegmentError> {
        assert!(first_index <= last_index, "a segment covers at least one index");
        let temporary = Temporary::create(dir, first_index, last_index, spare)?;
        let file = temporary.file.try_clone().map_err(io_error(&temporary.temporary))?;
        let mut out = std::io::BufWriter::with_capacity(buffer_bytes, file);
        // The header, whose record count is known at the end, is written then.
        out.write_all(&[0; HEADER_BYTES])
            .map_err(io_error(&temporary.temporary))?;
        Ok(SegmentWriter {
            out,
            temporary,
            first_index,
            last_index,
            offset: HEADER_BYTES as u64,
            entries: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// Appends `record`, whose key must follow the previous record's.
    pub fn push(&mut self, record: &Record) -> Result<(), SegmentError> {
        assert!(
            (self.first_index..=self.last_index).contains(&record.version),
            "a record's version lies in its segment's range"
        );
        assert!(
            self.entries.last().is_none_or(|last| last.key < record.key),
            "records are sorted by key, one per key"
        );
        self.scratch.clear();
        encode_record(&mut self.scratch, record);
        self.out
            .write_all(&self.scratch)
            .map_err(io_error(&self.temporary.temporary))?;
        self.entries.push(IndexEntry {
            key: Bytes::copy_from_slice(&record.key),
            version: record.version,
            is_tombstone: record.value.is_none(),
            record_offset: self.offset,
            value_len: record.value.as_ref().map_or(0, Bytes::len) as u32,
        });
        self.offset += self.scratch.len() as u64;
        Ok(())
    }

    /// Writes the index, the footer and the header, renames the file into place and returns its
    /// path and index. Nothing is synced (see `write_segment_bytes`).
    pub fn finish(mut self) -> Result<(PathBuf, SegmentIndex), SegmentError> {
        let record_count = u32::try_from(self.entries.len()).expect("fewer than 2^32 records in a segment");
        let index_offset = self.offset;
        let mut index_crc = crc32fast::Hasher::new();
        for entry in &self.entries {
            self.scratch.clear();
            encode_index_entry(&mut self.scratch, entry);
            index_crc.update(&self.scratch);
            self.out
                .write_all(&self.scratch)
                .map_err(io_error(&self.temporary.temporary))?;
            self.offset += self.scratch.len() as u64;
        }
        let footer = encode_footer(
            index_offset,
            self.offset - index_offset,
            record_count,
            index_crc.finalize(),
        );
        self.out
            .write_all(&footer)
            .map_err(io_error(&self.temporary.temporary))?;
        let file_bytes = self.offset + FOOTER_BYTES as u64;
        self.out.flush().map_err(io_error(&self.temporary.temporary))?;
        let header = SegmentHeader {
            first_index: self.first_index,
            last_index: self.last_index,
            record_count,
            log_order: false,
        };
        self.temporary
            .file
            .write_all_at(&encode_header(&header), 0)
            .map_err(io_error(&self.temporary.temporary))?;
        let path = self.temporary.put_in_place(file_bytes)?;
        let index = SegmentIndex {
            header,
            entries: self.entries,
            file_bytes,
        };
        debug_assert_eq!(
            read_segment_index(&path).expect("a segment just written reads back"),
            index,
            "a segment reads back as it was written"
        );
        Ok((path, index))
    }
}

/// Reads a segment's records front to back, without its index, each checked against its
/// checksum and the header: what a merge reads, in memory bounded by the reader's buffer (at
/// most `buffer_bytes`, and no larger than the file).
pub struct RecordStream {
    path: PathBuf,
    reader: std::io::BufReader<File>,
    header: SegmentHeader,
    offset: u64,
    /// Where the index starts, which the records must reach exactly.
    records_end: u64,
    remaining: u32,
    previous: Option<Record>,
}

impl RecordStream {
    pub fn open(path: &Path, buffer_bytes: usize) -> Result<RecordStream, SegmentError> {
        let open = || -> Result<RecordStream, SegmentError> {
            use std::io::{Seek, SeekFrom};
            let mut file = File::open(path).map_err(io_error(path))?;
            let file_bytes = file.metadata().map_err(io_error(path))?.len();
            if file_bytes < (HEADER_BYTES + FOOTER_BYTES) as u64 {
                return Err(corrupt(file_bytes as usize, "shorter than a header and a footer"));
            }
            let mut header = [0; HEADER_BYTES];
            file.read_exact_at(&mut header, 0).map_err(io_error(path))?;
            let header = decode_header(&header)?;
            let mut footer = [0; FOOTER_BYTES];
            let footer_offset = file_bytes - FOOTER_BYTES as u64;
            file.read_exact_at(&mut footer, footer_offset).map_err(io_error(path))?;
            let (index_offset, _, record_count, _) = decode_footer(&footer, file_bytes)?;
            if header.record_count != record_count {
                return Err(corrupt(
                    footer_offset as usize,
                    "header and footer disagree on the record count",
                ));
            }
            file.seek(SeekFrom::Start(HEADER_BYTES as u64))
                .map_err(io_error(path))?;
            Ok(RecordStream {
                path: path.to_path_buf(),
                reader: std::io::BufReader::with_capacity(buffer_bytes.min(file_bytes as usize), file),
                header,
                offset: HEADER_BYTES as u64,
                records_end: index_offset,
                remaining: record_count,
                previous: None,
            })
        };
        open().map_err(in_file(path))
    }

    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// The next record and its offset, or `None` after the last.
    pub fn next_record(&mut self) -> Result<Option<(u64, Record)>, SegmentError> {
        self.read_next().map_err(in_file(&self.path))
    }

    fn read_next(&mut self) -> Result<Option<(u64, Record)>, SegmentError> {
        use std::io::Read;
        let at = self.offset as usize;
        if self.remaining == 0 {
            if self.offset != self.records_end {
                return Err(corrupt(at, "records do not end where the index starts"));
            }
            return Ok(None);
        }
        let room = self.records_end - self.offset;
        if room < RECORD_OVERHEAD_BYTES as u64 {
            return Err(corrupt(at, "truncated record"));
        }
        let mut fixed = [0; RECORD_OVERHEAD_BYTES];
        self.reader.read_exact(&mut fixed).map_err(io_error(&self.path))?;
        let key_len = u32::from_le_bytes(fixed[13..17].try_into().expect("4 bytes")) as u64;
        let value_len = u32::from_le_bytes(fixed[17..21].try_into().expect("4 bytes")) as u64;
        let len = RECORD_OVERHEAD_BYTES as u64 + key_len + value_len;
        if len > room {
            return Err(corrupt(at, "record runs into the index"));
        }
        let mut buf = Vec::with_capacity(len as usize);
        buf.extend_from_slice(&fixed);
        buf.resize(len as usize, 0);
        self.reader
            .read_exact(&mut buf[RECORD_OVERHEAD_BYTES..])
            .map_err(io_error(&self.path))?;
        let fields = decode_record_fields(&buf, at)?;
        if !(self.header.first_index..=self.header.last_index).contains(&fields.version) {
            return Err(corrupt(
                at,
                format!("version {} outside the segment's range", fields.version),
            ));
        }
        let buf = Bytes::from(buf);
        let record = Record {
            key: buf.slice(fields.key),
            value: fields.value.map(|range| buf.slice(range)),
            version: fields.version,
        };
        if let Some(previous) = &self.previous {
            let in_order = if self.header.log_order {
                previous.version <= record.version
            } else {
                previous.key < record.key
            };
            if !in_order {
                return Err(corrupt(at, "records out of order"));
            }
        }
        self.previous = Some(record.clone());
        self.offset += len;
        self.remaining -= 1;
        Ok(Some((at as u64, record)))
    }
}

/// The name of the `number`th spare file, `file_bytes` long: a retired segment's file kept to be
/// overwritten by a later segment. Start-up keeps them as spares, within the budget, and learns
/// their sizes from their names: a `stat` of each of hundreds of spares cost it milliseconds.
pub(crate) fn spare_file_name(number: u64, file_bytes: u64) -> String {
    format!("{number:020}-{file_bytes}.spare")
}

/// The number and size in a spare file's name (see `spare_file_name`); `None` for any other name.
pub(crate) fn parse_spare_name(name: &str) -> Option<(u64, u64)> {
    let (number, file_bytes) = name.strip_suffix(".spare")?.split_once('-')?;
    let (number, file_bytes) = (number.parse().ok()?, file_bytes.parse().ok()?);
    (spare_file_name(number, file_bytes) == name).then_some((number, file_bytes))
}

/// Makes creations, renames and removals in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), SegmentError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error(dir))
}

/// Creates `dir` if missing, its entry synced into its parent (which must exist or be creatable
/// the same way): segments synced into a directory a power cut can take away are not durable.
pub fn create_dir_durably(dir: &Path) -> Result<(), SegmentError> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    create_dir_durably(parent)?;
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io_error(dir)(e)),
        _ => {}
    }
    sync_dir(parent)
}

/// Verifies every part of a segment held in memory and returns its index.
pub fn verify_segment(buf: &[u8]) -> Result<SegmentIndex, SegmentError> {
    let index = decode_segment_index(buf)?;
    for entry in &index.entries {
        decode_record(&buf[entry.record_offset as usize..], entry)?;
    }
    Ok(index)
}

/// Bytes at the end of a segment that `read_segment_index` reads at once: the whole of a small
/// segment, and the footer and index of most others.
const INDEX_READ_BYTES: u64 = 128 << 10;

/// Reads a segment's header, footer and index — not its values — with positioned reads. At
/// start-up each read is a device round trip, so the file's tail is read in one, and only what
/// it does not cover (the header of a larger file, the start of a longer index) is read again.
pub fn read_segment_index(path: &Path) -> Result<SegmentIndex, SegmentError> {
    let file = File::open(path).map_err(io_error(path))?;
    let file_bytes = file.metadata().map_err(io_error(path))?.len();
    let tail_offset = file_bytes - file_bytes.min(INDEX_READ_BYTES);
    let mut tail = vec![0; (file_bytes - tail_offset) as usize];
    file.read_exact_at(&mut tail, tail_offset).map_err(io_error(path))?;
    load_index(file_bytes, |offset, len| {
        let end = offset + len as u64;
        if offset >= tail_offset {
            return Ok(Cow::Borrowed(
                &tail[(offset - tail_offset) as usize..(end - tail_offset) as usize],
            ));
        }
        let read_to = end.min(tail_offset);
        let mut buf = vec![0; (read_to - offset) as usize];
        file.read_exact_at(&mut buf, offset).map_err(io_error(path))?;
        if end > tail_offset {
            buf.extend_from_slice(&tail[..(end - tail_offset) as usize]);
        }
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
    fn a_segment_index_reads_back_whether_the_tail_read_covers_all_some_or_none_of_it() {
        let dir = tempfile::tempdir().unwrap();
        // Whole file in the tail; large values with the index in the tail and the header not;
        // an index longer than the tail.
        for (records, key_bytes, value_bytes) in [(10, 8, 10), (3, 8, 100_000), (5_000, 40, 1)] {
            let mut reducer = Reducer::new();
            for i in 0..records {
                let key = format!("{i:0key_bytes$}");
                reducer.write(i as u64 + 1, key.into(), Some(Bytes::from(vec![b'v'; value_bytes])));
            }
            let batch = reducer.take().unwrap();
            let (path, written) = write_segment(dir.path(), &batch, None).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(read_segment_index(&path).unwrap(), written, "{records} records");
            assert_eq!(decode_segment_index(&bytes).unwrap(), written, "{records} records");
        }
    }

    #[test]
    fn a_spare_name_gives_back_its_number_and_size_and_nothing_else_parses_as_one() {
        let name = spare_file_name(42, 9_672);
        assert_eq!(parse_spare_name(&name), Some((42, 9_672)));
        for other in [
            "00000000000000000042.spare",
            "42-9672.spare",
            "00000000000000000042-09672.spare",
            "00000000000000000042-9672.seg",
            "00000000000000000042--9672.spare",
        ] {
            assert_eq!(parse_spare_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_segment_written_over_a_longer_spare_is_exactly_itself() {
        let dir = tempfile::tempdir().unwrap();
        let spare = dir.path().join(spare_file_name(7, 64 * 1024));
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
        let (path, _, victim) = segment_with_a_flipped_record(dir.path());
        assert_names_the_flipped_record(&read_segment(&path).unwrap_err(), &path, victim);
        // The index alone is intact: start-up would load it, and the read of that value fails.
        assert!(read_segment_index(&path).is_ok());
    }

    /// A sample segment in `dir` whose second record has a bit flipped: its path, its bytes
    /// before the flip, and the record's offset.
    fn segment_with_a_flipped_record(dir: &Path) -> (PathBuf, Vec<u8>, usize) {
        let (path, index) = write_segment(dir, &sample_batch(), None).unwrap();
        let good = std::fs::read(&path).unwrap();
        let victim = index.entries[1].record_offset as usize;
        let mut flipped = good.clone();
        flipped[victim + RECORD_OVERHEAD_BYTES] ^= 0x20;
        std::fs::write(&path, &flipped).unwrap();
        (path, good, victim)
    }

    fn assert_names_the_flipped_record(error: &SegmentError, path: &Path, victim: usize) {
        let message = error.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(
            message.contains(&format!("at byte {victim}: record checksum mismatch")),
            "{message}"
        );
    }

    /// Every record a stream reads, with its offset.
    fn stream_all(path: &Path) -> Result<Vec<(u64, Record)>, SegmentError> {
        let mut stream = RecordStream::open(path, 16)?;
        let mut records = Vec::new();
        while let Some(read) = stream.next_record()? {
            records.push(read);
        }
        Ok(records)
    }

    #[test]
    fn a_segment_written_record_by_record_is_the_segment_encoded_at_once_and_streams_back() {
        let dir = tempfile::tempdir().unwrap();
        let batch = sample_batch();
        let mut writer = SegmentWriter::create(dir.path(), batch.first_index, batch.last_index, None, 16).unwrap();
        for record in &batch.records {
            writer.push(record).unwrap();
        }
        let (path, index) = writer.finish().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), encode_segment(&batch));
        assert_eq!(index, read_segment_index(&path).unwrap());
        let streamed = stream_all(&path).unwrap();
        assert_eq!(
            streamed.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
            batch.records
        );
        assert_eq!(
            streamed.iter().map(|(offset, _)| *offset).collect::<Vec<_>>(),
            index.entries.iter().map(|e| e.record_offset).collect::<Vec<_>>()
        );
        // A spare file longer than the segment is overwritten and cut to length.
        let spare = dir.path().join(spare_file_name(1, 10_000));
        std::fs::write(&spare, vec![7u8; 10_000]).unwrap();
        let writer = SegmentWriter::create(dir.path(), 200, 300, Some(spare.clone()), 16).unwrap();
        let (path, _) = writer.finish().unwrap();
        assert!(!spare.exists());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            encode_segment(&ReducedBatch {
                first_index: 200,
                last_index: 300,
                records: Vec::new(),
                log_order: false,
                writes_in: 0,
                bytes_in: 0,
            })
        );
    }

    #[test]
    fn a_stream_refuses_a_flipped_bit_or_a_cut_segment_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, good, victim) = segment_with_a_flipped_record(dir.path());
        assert_names_the_flipped_record(&stream_all(&path).unwrap_err(), &path, victim);
        // A huge key length is refused before anything is allocated for it.
        let mut huge = good.clone();
        huge[victim + 13..victim + 17].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&path, &huge).unwrap();
        assert!(stream_all(&path)
            .unwrap_err()
            .to_string()
            .contains("runs into the index"));
        for cut in [0, HEADER_BYTES, victim + 3, good.len() - 1] {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert!(stream_all(&path).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn an_empty_batch_of_reads_is_a_valid_segment() {
        let mut r = Reducer::new();
        r.note_index(5);
        let (header, records) = decode_segment(&encode_segment(&r.take().unwrap())).unwrap();
        assert_eq!((header.first_index, header.last_index, records.len()), (5, 5, 0));
    }
}
