//! The log's state machine for SQL: each committed command is a transaction (`Txn`) or a class
//! hand-over message (hybrid replication), handed to the writer in log order; a raft snapshot is a checkpoint of the database (see `checkpoint`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_log::{SnapshotFiles, StateMachine};

use crate::checkpoint::{self, Checkpoints};
use crate::database::Database;
use crate::readers::Readers;
use crate::txn::Command;
use crate::writer::{Applied, WriterHandle};

pub struct SqlState {
    writer: WriterHandle,
    readers: Arc<Readers>,
    checkpoints: Checkpoints,
}

impl SqlState {
    /// The state over `writer`'s database, rebuilt first if it does not stand where the raft
    /// snapshot (`snapshot`, the data of the node's latest one) and the log say.
    pub fn open(
        writer: WriterHandle,
        readers: Arc<Readers>,
        dir: PathBuf,
        snapshot: Option<&[u8]>,
    ) -> Result<Self, String> {
        let checkpoints = Checkpoints {
            dir,
            extension: readers.database().checkpoint_extension(),
        };
        checkpoints.remove_leftovers();
        let mark = snapshot.map(checkpoint::decode_mark).transpose()?;
        if writer.needs_rebuild(mark).map_err(|e| e.to_string())? {
            let from = mark.map(|m| checkpoints.path(m.log_index));
            tracing::warn!(
                dir = %checkpoints.dir.display(), checkpoint = ?from,
                "the database holds work the log may not have, stands before the last checkpoint, or \
                 was not closed when its node last stopped; rebuilding it from the checkpoint and the log"
            );
            writer
                .restore(from.as_deref(), mark.unwrap_or_default())
                .map_err(|e| format!("cannot rebuild the database: {e}"))?;
        }
        Ok(SqlState {
            writer,
            readers,
            checkpoints,
        })
    }
}

/// Deletes a shipped checkpoint's link once the shipment is over.
struct ShippedLink(PathBuf);

impl Drop for ShippedLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A linearizable read asks the log for nothing but a point to wait for: once the node has
/// applied up to the read index, the read runs on a reader connection.
pub struct Barrier;

impl StateMachine for SqlState {
    type Query = Barrier;
    type Output = Applied;

    fn apply(&mut self, index: u64, command: &[u8]) -> Applied {
        // Only this node's front ends write commands, and the raft log checksums them: a command
        // that does not decode is corruption.
        let command = Command::decode(command)
            .unwrap_or_else(|e| panic!("the SQL command at log index {index} does not decode: {e}"));
        self.writer.apply(index, command)
    }

    fn voters_changed(&mut self, voters: &[u64]) {
        self.writer.voters_changed(voters);
    }

    fn entry_applied(&mut self, _index: u64) {}

    /// The engine commits what a round of entries applied at once: one commit for all of them
    /// (the pages they share written once), and their clients told after it.
    fn round_applied(&mut self) {
        self.writer.entries_applied();
    }

    fn query(&mut self, _query: &Barrier) -> Applied {
        Applied::Committed
    }

    fn snapshot_ready(&mut self) -> bool {
        self.writer.checkpoint_ready()
    }

    /// A checkpoint copies the whole database: SQLite's file, or (PostgreSQL) about what the
    /// last dump was.
    fn snapshot_cost_bytes(&mut self) -> u64 {
        match self.readers.database() {
            Database::Sqlite { dir } => std::fs::metadata(crate::engine::database_path(dir)).map_or(0, |m| m.len()),
            Database::Postgres(_) => self.checkpoints.latest_size_bytes(),
        }
    }

    fn snapshot_later(&mut self) -> Box<dyn FnOnce() -> Vec<u8> + Send> {
        let mark = self.writer.applied();
        // Pinned here, the state is exactly the applied one (nothing is ahead of the log:
        // `snapshot_ready`); the copy is made from it off the node's thread.
        let pinned = self.readers.database().pin_for_checkpoint();
        self.writer.checkpoint_pinned();
        let checkpoints = self.checkpoints.clone();
        Box::new(move || {
            let copy = pinned.unwrap_or_else(|e| panic!("cannot pin the database for a checkpoint: {e}"));
            if let Err(e) = checkpoints.write(mark.log_index, copy) {
                panic!("cannot write the checkpoint at log index {}: {e}", mark.log_index);
            }
            checkpoint::encode_mark(&mark)
        })
    }

    fn snapshot_files(&mut self, snapshot: &[u8]) -> Result<SnapshotFiles, String> {
        let mark = checkpoint::decode_mark(snapshot)?;
        let source = self.checkpoints.path(mark.log_index);
        // A link keeps the file for the shipment even when a newer checkpoint replaces it.
        let link = self.checkpoints.dir.join(format!(
            "shipping-{}-{}.{}",
            mark.log_index,
            std::process::id(),
            self.checkpoints.extension
        ));
        let _ = std::fs::remove_file(&link);
        if let Err(e) = std::fs::hard_link(&source, &link) {
            // Some file systems have no hard links (FAT, many FUSE ones): a copy pins as well.
            std::fs::copy(&source, &link)
                .map_err(|copy| format!("cannot pin {} by a link ({e}) or a copy ({copy})", source.display()))?;
        }
        Ok(SnapshotFiles {
            files: vec![(self.checkpoints.shipped_name(), link.clone())],
            pin: Box::new(ShippedLink(link)),
        })
    }

    fn install_snapshot(&mut self, snapshot: &[u8], files_dir: &Path) -> Result<(), String> {
        let mark = checkpoint::decode_mark(snapshot)?;
        let received = files_dir.join(self.checkpoints.shipped_name());
        let kept = self.checkpoints.path(mark.log_index);
        std::fs::copy(&received, &kept)
            .and_then(|_| std::fs::File::open(&kept)?.sync_all())
            .map_err(|e| format!("cannot keep the received checkpoint: {e}"))?;
        self.readers.invalidate();
        self.writer.restore(Some(&kept), mark).map_err(|e| e.to_string())
    }

    fn snapshot_persisted(&mut self, snapshot: &[u8]) {
        let mark = checkpoint::decode_mark(snapshot).expect("a checkpoint position this node wrote decodes");
        self.checkpoints.remove_older(mark.log_index);
    }
}
