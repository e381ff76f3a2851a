//! Checkpoints: a copy of the database at a log position, fsynced, from which a node rebuilds
//! (after a crash that left work of its own the log does not have) and which a replica behind
//! the compacted log receives. A raft snapshot's data is the position (`AppliedMark`); its one
//! file is the checkpoint (a SQLite database, or a PostgreSQL dump).

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use crate::database::CheckpointCopy;
use crate::engine::AppliedMark;
use crate::txn::TxnId;

const MAGIC: &[u8; 4] = b"SQC1";

/// The checkpoints of one node: `checkpoint-INDEX.EXTENSION` files in its SQL directory.
#[derive(Debug, Clone)]
pub struct Checkpoints {
    pub dir: PathBuf,
    /// The engine's: `sqlite` or `pgdump`.
    pub extension: &'static str,
}

impl Checkpoints {
    pub fn path(&self, index: u64) -> PathBuf {
        self.dir.join(format!("checkpoint-{index:020}.{}", self.extension))
    }

    /// The name a checkpoint travels under to a lagging replica.
    pub fn shipped_name(&self) -> String {
        format!("checkpoint.{}", self.extension)
    }

    /// The checkpoints, by log index.
    fn list(&self) -> Vec<(u64, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let suffix = format!(".{}", self.extension);
        let mut found: Vec<(u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let index = name
                    .strip_prefix("checkpoint-")?
                    .strip_suffix(suffix.as_str())?
                    .parse()
                    .ok()?;
                Some((index, e.path()))
            })
            .collect();
        found.sort();
        found
    }

    /// The size of the newest checkpoint (0 if there is none).
    pub fn latest_size_bytes(&self) -> u64 {
        self.list()
            .last()
            .and_then(|(_, path)| std::fs::metadata(path).ok())
            .map_or(0, |m| m.len())
    }

    /// Removes the checkpoints older than `index` (a newer one is durable in the raft storage).
    pub fn remove_older(&self, index: u64) {
        for (older, path) in self.list().into_iter().filter(|(i, _)| *i < index) {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(index = older, error = %e, "cannot remove an old checkpoint");
            }
        }
    }

    /// Removes what a crash can leave behind: a checkpoint cut short, links of shipments that
    /// were under way.
    pub fn remove_leftovers(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
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

    /// Writes the checkpoint for `index` with `copy` (of a state pinned at that position),
    /// fsynced, and returns its path.
    pub fn write(&self, index: u64, copy: CheckpointCopy) -> std::io::Result<PathBuf> {
        let target = self.path(index);
        let temporary = target.with_extension("tmp");
        let _ = std::fs::remove_file(&temporary);
        copy(&temporary)?;
        std::fs::File::open(&temporary)?.sync_all()?;
        std::fs::rename(&temporary, &target)?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(target)
    }
}

/// Copies the SQLite database as `source` sees it (a read transaction pinned at the
/// checkpoint's position) into `target`.
pub fn copy_sqlite(source: &Connection, target: &Path) -> std::io::Result<()> {
    let mut copy = Connection::open(target).map_err(std::io::Error::other)?;
    let backup = rusqlite::backup::Backup::new(source, &mut copy).map_err(std::io::Error::other)?;
    // One step copies every page under the source's one read transaction.
    backup.step(-1).map(drop).map_err(std::io::Error::other)
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

    fn copy_of(reader: &std::sync::Arc<std::sync::Mutex<Connection>>) -> CheckpointCopy {
        let reader = reader.clone();
        Box::new(move |target: &Path| copy_sqlite(&reader.lock().unwrap(), target))
    }

    #[test]
    fn a_checkpoint_holds_the_state_its_reader_saw_not_later_writes() {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Sqlite::open(dir.path()).unwrap();
        engine.execute("CREATE TABLE t (n INTEGER)", &[]).unwrap();
        engine.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
        let reader = open_reader(dir.path()).unwrap();
        reader.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
        let reader = std::sync::Arc::new(std::sync::Mutex::new(reader));
        engine.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
        let checkpoints = Checkpoints {
            dir: dir.path().to_path_buf(),
            extension: "sqlite",
        };
        let written = checkpoints.write(7, copy_of(&reader)).unwrap();
        assert_eq!(checkpoints.list(), vec![(7, written.clone())]);
        let copy = Connection::open(&written).unwrap();
        let rows: i64 = copy.query_row("SELECT count(*) FROM t", (), |r| r.get(0)).unwrap();
        assert_eq!(rows, 1, "the checkpoint is the pinned state");
        drop(copy);
        checkpoints.write(9, copy_of(&reader)).unwrap();
        checkpoints.remove_older(9);
        assert_eq!(checkpoints.list().len(), 1);
        let cut_short = checkpoints.path(10).with_extension("tmp");
        std::fs::write(&cut_short, b"cut short").unwrap();
        checkpoints.remove_leftovers();
        assert_eq!(checkpoints.list().len(), 1);
        assert!(!cut_short.exists());
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
