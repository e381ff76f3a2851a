//! The log's state machine for SQL: each committed command is a transaction (`Txn`), handed to
//! the writer thread in log order.
//!
//! Snapshots are not built yet: a SQL node keeps its whole raft log (its node settings turn
//! snapshots off), and a node rebuilds its database by replaying it. Checkpoints with the
//! engine's backup, shipped to lagging replicas, are the next step of issue 15.

use std::path::Path;

use chorus_log::{SnapshotFiles, StateMachine};

use crate::txn::Txn;
use crate::writer::{Applied, WriterHandle};

pub struct SqlState {
    writer: WriterHandle,
}

impl SqlState {
    pub fn new(writer: WriterHandle) -> Self {
        SqlState { writer }
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

    fn entry_applied(&mut self, _index: u64) {}

    fn query(&mut self, _query: &Barrier) -> Applied {
        Applied::Committed
    }

    fn snapshot_later(&mut self) -> Box<dyn FnOnce() -> Vec<u8> + Send> {
        panic!("SQL nodes run with snapshots off until checkpoints are built (issue 15)")
    }

    fn snapshot_files(&mut self, _snapshot: &[u8]) -> Result<SnapshotFiles, String> {
        Err("SQL snapshots are not built yet (issue 15)".into())
    }

    fn install_snapshot(&mut self, _snapshot: &[u8], _files_dir: &Path) -> Result<(), String> {
        Err("SQL snapshots are not built yet (issue 15)".into())
    }

    fn snapshot_persisted(&mut self, _snapshot: &[u8]) {}
}
