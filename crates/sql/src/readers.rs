//! Read-only connections to the database, kept for reuse by reads off the writer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::database::{Database, ReaderConn};
use crate::error::SqlError;

/// Reader connections kept for reuse.
const IDLE_READERS: usize = 16;

pub struct Readers {
    database: Database,
    idle: Mutex<Vec<Reader>>,
    /// Bumped when the database is replaced: older connections read the old one.
    generation: AtomicU64,
}

/// A reader connection, and which database it opened.
pub struct Reader {
    pub conn: ReaderConn,
    generation: u64,
}

impl Readers {
    pub fn new(database: Database) -> Self {
        Readers {
            database,
            idle: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
        }
    }

    pub fn database(&self) -> &Database {
        &self.database
    }

    pub fn take(&self) -> Result<Reader, SqlError> {
        if let Some(reader) = self.idle.lock().expect("reader pool").pop() {
            return Ok(reader);
        }
        Ok(Reader {
            generation: self.generation.load(Ordering::Acquire),
            conn: self.database.open_reader()?,
        })
    }

    /// Keeps `reader` for reuse if it reads the current database and holds no transaction.
    pub fn give_back(&self, reader: Reader) {
        let mut idle = self.idle.lock().expect("reader pool");
        if idle.len() < IDLE_READERS
            && reader.conn.is_idle()
            && reader.generation == self.generation.load(Ordering::Acquire)
        {
            idle.push(reader);
        }
    }

    /// The database was replaced: no kept connection is reused.
    pub fn invalidate(&self) {
        let mut idle = self.idle.lock().expect("reader pool");
        self.generation.fetch_add(1, Ordering::AcqRel);
        idle.clear();
    }
}
