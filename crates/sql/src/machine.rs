//! The log's state machine for SQL: each committed command is a transaction (`Txn`), handed to
//! the writer in log order; a raft snapshot is a checkpoint of the database (see `checkpoint`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chorus_log::{SnapshotFiles, StateMachine};

use crate::checkpoint;
use crate::engine::open_reader;
use crate::readers::Readers;
use crate::txn::Txn;
use crate::writer::{Applied, WriterHandle};

pub struct SqlState {
    writer: WriterHandle,
    readers: Arc<Readers>,
    /// Where the database and its checkpoints live.
    dir: PathBuf,
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
        checkpoint::remove_leftovers(&dir);
        let mark = snapshot.map(checkpoint::decode_mark).transpose()?;
        if writer.needs_rebuild(mark).map_err(|e| e.to_string())? {
            let from = mark.map(|m| checkpoint::path(&dir, m.log_index));
            tracing::warn!(
                dir = %dir.display(), checkpoint = ?from,
                "the database holds work the log may not have, or stands before the last checkpoint; \
                 rebuilding it from the checkpoint and the log"
            );
            writer
                .restore(from.as_deref(), mark.unwrap_or_default())
                .map_err(|e| format!("cannot rebuild the database: {e}"))?;
        }
        Ok(SqlState { writer, readers, dir })
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
        let txn = Txn::decode(command)
            .unwrap_or_else(|e| panic!("the SQL transaction at log index {index} does not decode: {e}"));
        self.writer.apply(index, txn)
    }

    fn entry_applied(&mut self, _index: u64) {
        self.writer.entry_applied();
    }

    fn query(&mut self, _query: &Barrier) -> Applied {
        Applied::Committed
    }

    fn snapshot_ready(&mut self) -> bool {
        self.writer.checkpoint_ready()
    }

    /// A checkpoint copies the whole database file.
    fn snapshot_cost_bytes(&mut self) -> u64 {
        std::fs::metadata(crate::engine::database_path(&self.dir)).map_or(0, |m| m.len())
    }

    fn snapshot_later(&mut self) -> Box<dyn FnOnce() -> Vec<u8> + Send> {
        let mark = self.writer.applied();
        // A read transaction pinned here sees exactly the applied state (nothing is ahead of
        // the log: `snapshot_ready`); the copy is made from it off the node's thread.
        let pinned = open_reader(&self.dir).and_then(|reader| {
            reader
                .execute_batch("BEGIN; SELECT count(*) FROM _chorus_applied;")
                .map_err(|e| crate::SqlError::from_sqlite(&e))?;
            Ok(reader)
        });
        let dir = self.dir.clone();
        Box::new(move || {
            let reader = pinned.unwrap_or_else(|e| panic!("cannot pin the database for a checkpoint: {e}"));
            if let Err(e) = checkpoint::write(&reader, &dir, mark.log_index) {
                panic!("cannot write the checkpoint at log index {}: {e}", mark.log_index);
            }
            checkpoint::encode_mark(&mark)
        })
    }

    fn snapshot_files(&mut self, snapshot: &[u8]) -> Result<SnapshotFiles, String> {
        let mark = checkpoint::decode_mark(snapshot)?;
        let source = checkpoint::path(&self.dir, mark.log_index);
        // A link keeps the file for the shipment even when a newer checkpoint replaces it.
        let link = self
            .dir
            .join(format!("shipping-{}-{}.sqlite", mark.log_index, std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(&source, &link).map_err(|e| format!("cannot pin {}: {e}", source.display()))?;
        Ok(SnapshotFiles {
            files: vec![(checkpoint::SHIPPED_NAME.to_owned(), link.clone())],
            pin: Box::new(ShippedLink(link)),
        })
    }

    fn install_snapshot(&mut self, snapshot: &[u8], files_dir: &Path) -> Result<(), String> {
        let mark = checkpoint::decode_mark(snapshot)?;
        let received = files_dir.join(checkpoint::SHIPPED_NAME);
        let kept = checkpoint::path(&self.dir, mark.log_index);
        std::fs::copy(&received, &kept)
            .and_then(|_| std::fs::File::open(&kept)?.sync_all())
            .map_err(|e| format!("cannot keep the received checkpoint: {e}"))?;
        self.readers.invalidate();
        self.writer.restore(Some(&kept), mark).map_err(|e| e.to_string())
    }

    fn snapshot_persisted(&mut self, snapshot: &[u8]) {
        let mark = checkpoint::decode_mark(snapshot).expect("a checkpoint position this node wrote decodes");
        checkpoint::remove_older(&self.dir, mark.log_index);
    }
}
