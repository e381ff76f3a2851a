//! Backups: a snapshot of the replicated state taken at a linearizable point (`NodeHandle::
//! backup`), as one file a new cluster is restored from.
//!
//! The file is `CHBAK001`, a length-prefixed header — the snapshot's index and term, the
//! configuration it was taken under, the snapshot data (state machine, entry codec, members'
//! addresses) and the name and size of each file the state needs besides — then those files'
//! bytes in that order, then the SHA-256 of everything before it. The sizes up front let a node
//! stream a backup without holding it, and a reader check it without trusting it.
//!
//! A restore puts the header and the files in a node's `DATA_DIR/restore`; the node, starting
//! on an empty log, installs them as it would a leader's snapshot, under the new cluster's
//! configuration (`node::start`).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::ConfState;
use sha2::{Digest, Sha256};

use crate::error::DecodeError;
use crate::wire::{put_blob, put_u32, put_u64, Reader};

pub const BACKUP_MAGIC: &[u8; 8] = b"CHBAK001";
/// Where a restored node finds its backup, in its data directory.
pub const RESTORE_DIR: &str = "restore";
/// The header's file in `RESTORE_DIR`.
pub const HEADER_FILE: &str = "backup.header";
/// Where, in `RESTORE_DIR`, the state is given links to the backup's files to install.
pub const INSTALLING_DIR: &str = "installing";
const DIGEST_BYTES: usize = 32;
/// Most bytes a header may claim: its snapshot data is held in memory.
const MAX_HEADER_BYTES: usize = 1 << 30;
const MAX_FILES: usize = 1 << 20;

/// What a backup holds besides its files' bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct BackupHeader {
    pub index: u64,
    pub term: u64,
    pub conf_state: ConfState,
    /// The raft snapshot's data (`node::join_snapshot`).
    pub data: Vec<u8>,
    /// Each file's name and size in bytes, in the order their bytes follow.
    pub files: Vec<(String, u64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a Chorus backup, or is damaged: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// The magic and the length-prefixed header: what a backup starts with.
pub fn encode_header(header: &BackupHeader) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + header.data.len() + header.files.len() * 48);
    put_u64(&mut body, header.index);
    put_u64(&mut body, header.term);
    put_blob(
        &mut body,
        &header
            .conf_state
            .write_to_bytes()
            .expect("encoding a ConfState cannot fail"),
    );
    put_blob(&mut body, &header.data);
    put_u32(&mut body, header.files.len() as u32);
    for (name, size) in &header.files {
        put_blob(&mut body, name.as_bytes());
        put_u64(&mut body, *size);
    }
    let mut out = BACKUP_MAGIC.to_vec();
    put_blob(&mut out, &body);
    out
}

/// Decodes what `encode_header` wrote (magic included).
pub fn decode_header(buf: &[u8]) -> Result<BackupHeader, DecodeError> {
    let mut r = Reader::new(buf);
    if r.bytes(BACKUP_MAGIC.len())? != BACKUP_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let body = r.blob()?;
    r.finish()?;
    let mut r = Reader::new(body);
    let index = r.u64()?;
    let term = r.u64()?;
    let conf_state = ConfState::parse_from_bytes(r.blob()?).map_err(|_| DecodeError::Invalid("conf state"))?;
    let data = r.blob()?.to_vec();
    let count = r.u32()? as usize;
    if count > MAX_FILES {
        return Err(DecodeError::TooLarge {
            size: count,
            limit: MAX_FILES,
        });
    }
    let mut files = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let name = std::str::from_utf8(r.blob()?)
            .ok()
            .filter(|name| plain_file_name(name))
            .ok_or(DecodeError::Invalid("file name"))?;
        files.push((name.to_string(), r.u64()?));
    }
    r.finish()?;
    Ok(BackupHeader {
        index,
        term,
        conf_state,
        data,
        files,
    })
}

/// A name that stays inside the directory it is written to.
fn plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name != HEADER_FILE
        && name != INSTALLING_DIR
        && !name.contains(['/', '\0'])
}

/// The bytes of the backup of `header`: what `write_backup` writes.
pub fn backup_bytes(header: &BackupHeader) -> u64 {
    encode_header(header).len() as u64 + header.files.iter().map(|(_, size)| size).sum::<u64>() + DIGEST_BYTES as u64
}

/// Writes the backup of `header`, whose files are read from `paths` (in its order), to `out`,
/// digest last.
pub fn write_backup(header: &BackupHeader, paths: &[PathBuf], out: &mut impl Write) -> std::io::Result<()> {
    assert_eq!(header.files.len(), paths.len(), "a path per file");
    let mut digest = Sha256::new();
    let head = encode_header(header);
    digest.update(&head);
    out.write_all(&head)?;
    let mut buf = vec![0u8; 1 << 20];
    for ((name, size), path) in header.files.iter().zip(paths) {
        let mut file = File::open(path)?.take(*size);
        let mut copied = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            digest.update(&buf[..n]);
            out.write_all(&buf[..n])?;
            copied += n as u64;
        }
        if copied != *size {
            return Err(std::io::Error::other(format!(
                "{name} shrank while it was backed up: {copied} of {size} bytes"
            )));
        }
    }
    out.write_all(&digest.finalize())
}

/// Checks the backup at `path` and unpacks it into `into` (created): the header as
/// `HEADER_FILE`, each file under its name, all fsynced. Returns the header.
pub fn unpack(path: &Path, into: &Path) -> Result<BackupHeader, BackupError> {
    read_backup(path, Some(into))
}

/// Checks the backup at `path` (its structure and its SHA-256) without writing anything.
pub fn verify(path: &Path) -> Result<BackupHeader, BackupError> {
    read_backup(path, None)
}

fn read_backup(path: &Path, into: Option<&Path>) -> Result<BackupHeader, BackupError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| BackupError::Io { path: p, source }
    };
    let malformed = |reason: String| BackupError::Malformed {
        path: path.to_path_buf(),
        reason,
    };
    let mut input = BufReader::with_capacity(1 << 20, File::open(path).map_err(io(path))?);
    let mut digest = Sha256::new();
    let mut start = [0u8; 12];
    input
        .read_exact(&mut start)
        .map_err(|_| malformed("shorter than a header".into()))?;
    if &start[..8] != BACKUP_MAGIC {
        return Err(malformed(if start.starts_with(b"CHBAK") {
            "a backup format this build does not read (run the Chorus version that wrote it)".into()
        } else {
            "no CHBAK001 magic".into()
        }));
    }
    let body_len = u32::from_le_bytes([start[8], start[9], start[10], start[11]]) as usize;
    if body_len > MAX_HEADER_BYTES {
        return Err(malformed(format!("a header of {body_len} bytes")));
    }
    let mut head = start.to_vec();
    head.resize(12 + body_len, 0);
    input
        .read_exact(&mut head[12..])
        .map_err(|_| malformed("cut short in its header".into()))?;
    let header = decode_header(&head).map_err(|e| malformed(format!("header: {e}")))?;
    digest.update(&head);
    if let Some(into) = into {
        std::fs::create_dir_all(into).map_err(io(into))?;
    }
    let mut buf = vec![0u8; 1 << 20];
    for (name, size) in &header.files {
        let target = into.map(|into| into.join(name));
        let mut out = match &target {
            Some(target) => Some(BufWriter::new(File::create(target).map_err(io(target))?)),
            None => None,
        };
        let mut left = *size;
        while left > 0 {
            let want = buf.len().min(left as usize);
            input
                .read_exact(&mut buf[..want])
                .map_err(|_| malformed(format!("cut short in {name}")))?;
            digest.update(&buf[..want]);
            if let (Some(out), Some(target)) = (&mut out, &target) {
                out.write_all(&buf[..want]).map_err(io(target))?;
            }
            left -= want as u64;
        }
        if let (Some(out), Some(target)) = (out, &target) {
            let file = out.into_inner().map_err(|e| BackupError::Io {
                path: target.clone(),
                source: e.into_error(),
            })?;
            file.sync_all().map_err(io(target))?;
        }
    }
    let mut stored = [0u8; DIGEST_BYTES];
    input
        .read_exact(&mut stored)
        .map_err(|_| malformed("cut short before its checksum".into()))?;
    if input.read(&mut [0u8; 1]).map_err(io(path))? != 0 {
        return Err(malformed("bytes after its checksum".into()));
    }
    if digest.finalize().as_slice() != stored {
        return Err(malformed("its SHA-256 does not match: the file is damaged".into()));
    }
    let Some(into) = into else {
        return Ok(header);
    };
    let header_path = into.join(HEADER_FILE);
    std::fs::write(&header_path, &head).map_err(io(&header_path))?;
    File::open(&header_path)
        .and_then(|f| f.sync_all())
        .map_err(io(&header_path))?;
    File::open(into).and_then(|d| d.sync_all()).map_err(io(into))?;
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(files: Vec<(String, u64)>) -> BackupHeader {
        BackupHeader {
            index: 42,
            term: 3,
            conf_state: ConfState {
                voters: vec![1, 2, 3],
                ..Default::default()
            },
            data: b"snapshot data".to_vec(),
            files,
        }
    }

    #[test]
    fn a_backup_unpacks_to_what_was_written_and_any_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, vec![7u8; 3_000_000]).unwrap();
        std::fs::write(&b, b"bee").unwrap();
        let written = header(vec![("seg-1".into(), 3_000_000), ("seg-2".into(), 3)]);
        let mut bytes = Vec::new();
        write_backup(&written, &[a, b], &mut bytes).unwrap();
        assert_eq!(
            backup_bytes(&written),
            bytes.len() as u64,
            "the length announced up front"
        );
        let backup = dir.path().join("backup.chorus");
        std::fs::write(&backup, &bytes).unwrap();
        let into = dir.path().join("restore");
        assert_eq!(verify(&backup).unwrap(), written);
        assert_eq!(unpack(&backup, &into).unwrap(), written);
        assert_eq!(std::fs::read(into.join("seg-2")).unwrap(), b"bee");
        assert_eq!(
            decode_header(&std::fs::read(into.join(HEADER_FILE)).unwrap()).unwrap(),
            written
        );

        let damaged_at = |at: usize| {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            std::fs::write(&backup, &damaged).unwrap();
            assert!(verify(&backup).is_err());
            unpack(&backup, &dir.path().join("again")).unwrap_err().to_string()
        };
        assert!(damaged_at(bytes.len() / 2).contains("SHA-256"));
        assert!(damaged_at(0).contains("magic"));
        assert!(damaged_at(bytes.len() - 1).contains("SHA-256"));
        std::fs::write(&backup, &bytes[..bytes.len() - 10]).unwrap();
        assert!(unpack(&backup, &dir.path().join("cut"))
            .unwrap_err()
            .to_string()
            .contains("cut short"));
    }

    #[test]
    fn headers_with_escaping_names_or_nonsense_are_refused() {
        for name in ["../etc", "a/b", "", "..", HEADER_FILE] {
            let bytes = encode_header(&header(vec![(name.to_string(), 1)]));
            assert_eq!(
                decode_header(&bytes),
                Err(DecodeError::Invalid("file name")),
                "{name:?}"
            );
        }
        let good = encode_header(&header(vec![("seg".into(), 1)]));
        for cut in 0..good.len() {
            assert!(decode_header(&good[..cut]).is_err(), "cut at {cut}");
        }
    }
}
