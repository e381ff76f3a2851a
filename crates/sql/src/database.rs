//! Which engine a node runs, and what the node asks of it besides the writer's `Engine`:
//! connections for reads, and copies of the database for checkpoints.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::engine::{self, Column, Engine, Outcome};
use crate::error::SqlError;
use crate::postgres::{PgReader, PgServer};
use crate::text::Dialect;
use crate::txn::Value;

/// The database a node replicates into.
#[derive(Clone)]
pub enum Database {
    /// SQLite files under the node's SQL directory.
    Sqlite { dir: PathBuf },
    /// The node's own PostgreSQL server.
    Postgres(Arc<PgServer>),
}

/// Writes a checkpoint's copy of the database into the file it is given.
pub type CheckpointCopy = Box<dyn FnOnce(&Path) -> std::io::Result<()> + Send>;

impl Database {
    pub fn dialect(&self) -> Dialect {
        match self {
            Database::Sqlite { .. } => Dialect::Sqlite,
            Database::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The writer's connection.
    pub fn open_engine(&self) -> Result<Box<dyn Engine>, SqlError> {
        Ok(match self {
            Database::Sqlite { dir } => Box::new(engine::Sqlite::open(dir)?),
            Database::Postgres(server) => Box::new(crate::postgres::Postgres::open(server.clone())?),
        })
    }

    /// A read-only connection.
    pub fn open_reader(&self) -> Result<ReaderConn, SqlError> {
        Ok(match self {
            Database::Sqlite { dir } => ReaderConn::Sqlite(engine::open_reader(dir)?),
            Database::Postgres(server) => ReaderConn::Postgres(Box::new(PgReader::open(server)?)),
        })
    }

    /// The suffix of this engine's checkpoint files.
    pub fn checkpoint_extension(&self) -> &'static str {
        match self {
            Database::Sqlite { .. } => "sqlite",
            Database::Postgres(_) => "pgdump",
        }
    }

    /// Pins the database as it stands now (nothing may be ahead of the log) and returns what
    /// copies that state into a file, off the node's thread.
    pub fn pin_for_checkpoint(&self) -> Result<CheckpointCopy, SqlError> {
        match self {
            Database::Sqlite { dir } => {
                let reader = engine::open_reader(dir)?;
                reader
                    .execute_batch("BEGIN; SELECT count(*) FROM _chorus_applied;")
                    .map_err(|e| SqlError::from_sqlite(&e))?;
                Ok(Box::new(move |target: &Path| {
                    crate::checkpoint::copy_sqlite(&reader, target)
                }))
            }
            Database::Postgres(server) => crate::postgres::pin_for_checkpoint(server),
        }
    }
}

/// A read-only connection of either engine.
pub enum ReaderConn {
    Sqlite(rusqlite::Connection),
    /// Boxed: a client and its prepared statements are large beside a SQLite handle.
    Postgres(Box<PgReader>),
}

impl ReaderConn {
    /// Runs one statement off the node's thread.
    pub async fn run(self, sql: String, params: Vec<Value>) -> (ReaderConn, Result<Outcome, SqlError>) {
        tokio::task::spawn_blocking(move || match self {
            ReaderConn::Sqlite(conn) => {
                let outcome = engine::run(&conn, &sql, &params);
                (ReaderConn::Sqlite(conn), outcome)
            }
            ReaderConn::Postgres(mut reader) => {
                let outcome = reader.run(&sql, &params);
                (ReaderConn::Postgres(reader), outcome)
            }
        })
        .await
        .expect("a reader task does not panic")
    }

    /// Opens a read transaction: every statement until `end` sees the same state. (Its first
    /// read takes the snapshot: opening it is a short exchange, made here.)
    pub fn begin(&mut self) -> Result<(), SqlError> {
        match self {
            ReaderConn::Sqlite(conn) => conn.execute_batch("BEGIN").map_err(|e| SqlError::from_sqlite(&e)),
            ReaderConn::Postgres(reader) => reader.begin(),
        }
    }

    /// Ends the read transaction, if one is open.
    pub fn end(&mut self) {
        match self {
            ReaderConn::Sqlite(conn) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
            }
            ReaderConn::Postgres(reader) => reader.end(),
        }
    }

    /// Whether no transaction is open, so the connection can serve another session.
    pub fn is_idle(&self) -> bool {
        match self {
            ReaderConn::Sqlite(conn) => conn.is_autocommit(),
            ReaderConn::Postgres(reader) => reader.is_idle(),
        }
    }

    /// The columns `sql` returns, if the engine can plan it now.
    pub fn describe(&mut self, sql: &str) -> Option<Vec<Column>> {
        match self {
            ReaderConn::Sqlite(conn) => conn
                .prepare(sql)
                .ok()
                .map(|prepared| engine::columns_of(&prepared, sql)),
            ReaderConn::Postgres(reader) => reader.describe(sql),
        }
    }
}
