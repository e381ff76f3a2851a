//! The SQL replication middleware: PostgreSQL clients on the front, a database engine behind
//! one trait (SQLite embedded), and the raft log in between — the database is replicated
//! without touching its code (SQLware's thesis).
//!
//! Active replication: the leader executes each client transaction (the writer thread, one at
//! a time as the engine allows), makes it deterministic before anything runs (clock reads
//! fixed, random values seeded), commits it locally ahead of the log and proposes the statements
//! it ran; every replica re-executes them in log order. COMMIT returns once the log applied
//! the transaction (fsynced on a majority). See `writer` for how a leader executing ahead of
//! the log stays exact.

pub mod engine;
pub mod error;
mod front;
pub mod machine;
pub mod text;
pub mod txn;
pub mod writer;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chorus_log::{EntryCodec, NodeConfig, NodeHandle};

use crate::engine::Engine;
use tokio::net::TcpListener;

pub use error::SqlError;
pub use front::{serve, Shared};
pub use machine::SqlState;

/// Settings of a SQL node besides its raft node's.
pub struct SqlOptions {
    /// How long a COMMIT waits for the log before its outcome is reported unknown.
    pub commit_timeout: Duration,
    /// How long a transaction waits for another session's to release the write lock.
    pub lock_wait: Duration,
    /// Called when the database no longer matches the log (a leader that executed ahead lost
    /// its place): the node must restart, and rebuilds the database from the log when it does.
    pub on_diverged: Box<dyn FnOnce() + Send>,
}

/// Opens the database under `sql_dir` (rebuilding it from the log if it holds transactions the
/// log may not have), starts the writer and the raft node, and serves PostgreSQL clients on
/// `listener`.
pub async fn start(
    mut node_config: NodeConfig,
    sql_dir: &Path,
    listener: TcpListener,
    codec: Box<dyn EntryCodec>,
    options: SqlOptions,
) -> Result<NodeHandle<SqlState>, StartError> {
    let mut engine = engine::Sqlite::open(sql_dir).map_err(StartError::Database)?;
    if engine.holds_ahead().map_err(StartError::Database)? {
        tracing::warn!(
            dir = %sql_dir.display(),
            "the database holds transactions executed ahead of the log; rebuilding it from the log"
        );
        drop(engine);
        engine::Sqlite::remove(sql_dir).map_err(|e| StartError::Database(SqlError::new("58030", e.to_string())))?;
        engine = engine::Sqlite::open(sql_dir).map_err(StartError::Database)?;
    }
    let (proposals, proposal_queue) = tokio::sync::mpsc::unbounded_channel();
    let writer = writer::start(
        Box::new(engine),
        writer::WriterOptions {
            lock_wait: options.lock_wait,
            on_diverged: options.on_diverged,
        },
        proposals,
    )
    .map_err(StartError::Database)?;
    // Snapshots wait for checkpoints (see `machine`): the whole log is kept.
    node_config.snapshot_interval_entries = u64::MAX;
    node_config.snapshot_interval_bytes = u64::MAX;
    let state_writer = writer.clone();
    let node = chorus_log::start(node_config, move |_| Ok(SqlState::new(state_writer)), codec, None)
        .await
        .map_err(StartError::Node)?;
    tokio::spawn(front::propose_in_order(node.clone(), proposal_queue));
    let shared = Shared::new(node.clone(), writer, sql_dir.to_path_buf(), options.commit_timeout);
    tokio::spawn(serve(listener, Arc::clone(&shared)));
    Ok(node)
}

/// Why a SQL node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the database: {0}")]
    Database(SqlError),
    #[error("the raft node: {0}")]
    Node(chorus_log::StartError),
}
