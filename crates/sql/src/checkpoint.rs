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

/// How much of a checkpoint is written between two flushes to the device. A database of
/// gigabytes copied in one go leaves that much dirty in the page cache, and the raft log's
/// next fsync on the same file system waits behind it: a leader stalled past the election
/// timeout (docs/benchmarks.md, five nodes at 20 warehouses).
const COPY_FLUSH_BYTES: i64 = 32 << 20;

/// Copies the SQLite database as `source` sees it (a read transaction pinned at the
/// checkpoint's position) into `target`.
pub fn copy_sqlite(source: &Connection, target: &Path) -> std::io::Result<()> {
    copy_sqlite_flushing_every(source, target, COPY_FLUSH_BYTES)
}

fn copy_sqlite_flushing_every(source: &Connection, target: &Path, flush_bytes: i64) -> std::io::Result<()> {
    let page_size: i64 = source
        .query_row("PRAGMA page_size", (), |row| row.get(0))
        .map_err(std::io::Error::other)?;
    let pages_per_step = (flush_bytes / page_size.max(1)).clamp(1, i64::from(i32::MAX)) as i32;
    let mut copy = Connection::open(target).map_err(std::io::Error::other)?;
    let written = std::fs::File::open(target)?;
    let backup = rusqlite::backup::Backup::new(source, &mut copy).map_err(std::io::Error::other)?;
    // Every step reads under the source's one read transaction, so the steps together copy
    // the pinned state, however the database changes meanwhile.
    loop {
        match backup.step(pages_per_step).map_err(std::io::Error::other)? {
            rusqlite::backup::StepResult::Done => return Ok(()),
            rusqlite::backup::StepResult::More => written.sync_data()?,
            // Another connection writing the copy: nothing does; wait and go on.
            _ => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
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
    fn a_checkpoint_copied_in_many_steps_is_the_pinned_state_while_the_database_changes() {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Sqlite::open(dir.path()).unwrap();
        engine
            .execute("CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER, pad BLOB)", &[])
            .unwrap();
        engine
            .execute(
                "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < 2000) \
                 INSERT INTO t SELECT i, 1, randomblob(1000) FROM k",
                &[],
            )
            .unwrap();
        let reader = open_reader(dir.path()).unwrap();
        reader.execute_batch("BEGIN; SELECT count(*) FROM t;").unwrap();
        let copying = std::sync::atomic::AtomicBool::new(true);
        let target = dir.path().join("copy.sqlite");
        let updates = std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                let mut updates = 0;
                while copying.load(std::sync::atomic::Ordering::Relaxed) || updates == 0 {
                    engine
                        .execute("UPDATE t SET n = n + 1, pad = randomblob(1000) WHERE id % 7 = 0", &[])
                        .unwrap();
                    updates += 1;
                }
                updates
            });
            // 8 KiB per step: about 250 steps over 2 MB.
            copy_sqlite_flushing_every(&reader, &target, 8 << 10).unwrap();
            copying.store(false, std::sync::atomic::Ordering::Relaxed);
            writer.join().unwrap()
        });
        assert!(updates > 1, "the database changed while it was copied");
        let copy = Connection::open(&target).unwrap();
        let (rows, total): (i64, i64) = copy
            .query_row("SELECT count(*), sum(n) FROM t", (), |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!((rows, total), (2000, 2000), "the copy is the pinned state");
        let check: String = copy.query_row("PRAGMA integrity_check", (), |r| r.get(0)).unwrap();
        assert_eq!(check, "ok");
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
