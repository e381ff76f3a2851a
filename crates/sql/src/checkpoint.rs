//! Checkpoints: a copy of the database at a log position, fsynced, from which a node rebuilds
//! (after a crash that left work of its own the log does not have) and which a replica behind
//! the compacted log receives. A raft snapshot's data is the position (`AppliedMark`); its one
//! file is the checkpoint.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::engine::AppliedMark;
use crate::txn::TxnId;

/// The name a checkpoint travels under to a lagging replica.
pub const SHIPPED_NAME: &str = "checkpoint.sqlite";

const MAGIC: &[u8; 4] = b"SQC1";

pub fn path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("checkpoint-{index:020}.sqlite"))
}

/// The checkpoints in `dir`, by log index.
fn list(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let index = name
                .strip_prefix("checkpoint-")?
                .strip_suffix(".sqlite")?
                .parse()
                .ok()?;
            Some((index, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// Removes the checkpoints older than `index` (a newer one is durable in the raft storage).
pub fn remove_older(dir: &Path, index: u64) {
    for (older, path) in list(dir).into_iter().filter(|(i, _)| *i < index) {
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(index = older, error = %e, "cannot remove an old checkpoint");
        }
    }
}

/// Removes what a crash can leave behind: a checkpoint cut short, links of shipments that were
/// under way.
pub fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let cut_short = name.starts_with("checkpoint-") && name.ends_with(".tmp");
        if cut_short || name.starts_with("shipping-") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Copies the database as `source` sees it (a read transaction pinned at the checkpoint's
/// position) into the checkpoint for `index`, fsynced.
pub fn write(source: &Connection, dir: &Path, index: u64) -> std::io::Result<PathBuf> {
    let target = path(dir, index);
    let temporary = target.with_extension("tmp");
    let _ = std::fs::remove_file(&temporary);
    {
        let mut copy = Connection::open(&temporary).map_err(std::io::Error::other)?;
        let backup = rusqlite::backup::Backup::new(source, &mut copy).map_err(std::io::Error::other)?;
        // One step copies every page under the source's one read transaction.
        backup.step(-1).map_err(std::io::Error::other)?;
    }
    std::fs::File::open(&temporary)?.sync_all()?;
    std::fs::rename(&temporary, &target)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(target)
}

pub fn encode_mark(mark: &AppliedMark) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&mark.log_index.to_le_bytes());
    out.extend_from_slice(&mark.command.to_le_bytes());
    out.extend_from_slice(&mark.last_txn.incarnation.to_le_bytes());
    out.extend_from_slice(&mark.last_txn.seq.to_le_bytes());
    out
}

pub fn decode_mark(bytes: &[u8]) -> Result<AppliedMark, String> {
    if bytes.len() != 32 || &bytes[..4] != MAGIC {
        return Err(format!("not a SQL checkpoint position ({} bytes)", bytes.len()));
    }
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    Ok(AppliedMark {
        log_index: u64_at(4),
        command: u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")),
        last_txn: TxnId {
            incarnation: u64_at(16),
            seq: u64_at(24),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{open_reader, Engine, Sqlite};

    #[test]
    fn a_checkpoint_holds_the_state_its_reader_saw_not_later_writes() {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Sqlite::open(dir.path()).unwrap();
        engine.execute("CREATE TABLE t (n INTEGER)", &[]).unwrap();
        engine.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
        let reader = open_reader(dir.path()).unwrap();
        reader.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
        engine.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
        let written = write(&reader, dir.path(), 7).unwrap();
        assert_eq!(list(dir.path()), vec![(7, written.clone())]);
        let copy = Connection::open(&written).unwrap();
        let rows: i64 = copy.query_row("SELECT count(*) FROM t", (), |r| r.get(0)).unwrap();
        assert_eq!(rows, 1, "the checkpoint is the pinned state");
        drop(copy);
        write(&reader, dir.path(), 9).unwrap();
        remove_older(dir.path(), 9);
        assert_eq!(list(dir.path()).len(), 1);
        std::fs::write(path(dir.path(), 10).with_extension("tmp"), b"cut short").unwrap();
        remove_leftovers(dir.path());
        assert_eq!(list(dir.path()).len(), 1);
        assert!(!path(dir.path(), 10).with_extension("tmp").exists());
    }

    #[test]
    fn a_mark_decodes_as_encoded_and_bad_bytes_are_errors() {
        let mark = AppliedMark {
            log_index: 5,
            command: 2,
            last_txn: TxnId { incarnation: 3, seq: 4 },
        };
        assert_eq!(decode_mark(&encode_mark(&mark)).unwrap(), mark);
        assert!(decode_mark(&encode_mark(&mark)[..31]).is_err());
        assert!(decode_mark(b"XXXX0000000000000000000000000000").is_err());
    }
}
