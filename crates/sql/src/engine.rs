//! The database under the middleware, behind one trait: SQLite embedded (here), PostgreSQL
//! (`postgres`).
//!
//! The engine keeps two things of Chorus's own, in the same transactions as the data: the log
//! position and the last transaction applied (`_chorus_applied`), so a restart resumes exactly;
//! and the transactions a leader executed ahead of the log (`_chorus_ahead`), so a restart
//! knows whether the file holds work the log may not have (see `machine`).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::ffi::c_int;

use rusqlite::config::DbConfig;
use rusqlite::ffi;
use rusqlite::functions::FunctionFlags;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags};

use crate::capture::Capture;
use crate::certify::{Chain, Remembered, Touch};
use crate::classes::Schema;
use crate::error::SqlError;
use crate::text::Dialect;
use crate::txn::{Statement, TxnId, Value};

/// A result column: its name, the type its table declares (none for an expression), and the
/// function computing it, when the select list says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub declared: Option<String>,
    pub function: Option<String>,
}

/// What a statement gave.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Value>>,
    /// Rows inserted, updated or deleted.
    pub changes: u64,
    /// The engine says the statement cannot have changed the database.
    pub read_only: bool,
}

/// Where the engine's state stands in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppliedMark {
    pub log_index: u64,
    /// Which command of the entry at `log_index` (an entry carries a batch of them).
    pub command: u32,
    pub last_txn: TxnId,
}

impl AppliedMark {
    /// Whether the command at (`log_index`, `command`) is already in the state.
    pub fn covers(&self, log_index: u64, command: u32) -> bool {
        (log_index, command) <= (self.log_index, self.command)
    }
}

/// What a transaction recorded for passive replication became at its commit.
#[derive(Debug, PartialEq)]
pub enum Recorded {
    /// It changed nothing, and was rolled back.
    Nothing,
    /// Committed ahead of the log; replicas apply this write-set.
    WriteSet(Vec<u8>),
    /// Committed ahead of the log, but its changes cannot travel as a write-set (why not).
    Unrecordable(String),
}

/// One writer's view of a database engine (see `writer`).
pub trait Engine: Send {
    /// The SQL this engine reads, where rewritten statements must differ.
    fn dialect(&self) -> Dialect;
    fn begin(&mut self) -> Result<(), SqlError>;
    /// Commits the open transaction; a recording of its writes ends with it, as on rollback.
    fn commit(&mut self) -> Result<(), SqlError>;
    fn rollback(&mut self);
    /// Random values of the next statements come from this seed.
    fn seed(&mut self, seed: u64);
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<Outcome, SqlError>;
    /// Executes statements whose results nobody reads (a replica replaying a transaction),
    /// each after seeding its randoms with its seed. An engine behind a connection sends them
    /// all before it waits for the first reply.
    fn execute_unread(&mut self, statements: &[(u64, &Statement)]) -> Result<(), SqlError> {
        statements.iter().try_for_each(|(seed, statement)| {
            self.seed(*seed);
            self.execute(&statement.sql, &statement.params).map(drop)
        })
    }
    /// Inside the open transaction: the engine's state is now at `mark`.
    fn mark_applied(&mut self, mark: AppliedMark) -> Result<(), SqlError>;
    /// Inside the open transaction: it is executed ahead of the log as `id`.
    fn mark_ahead(&mut self, id: TxnId) -> Result<(), SqlError>;
    /// Inside the open transaction: `id`, executed ahead, is now in the log.
    fn clear_ahead(&mut self, id: TxnId) -> Result<(), SqlError>;
    fn applied(&mut self) -> Result<AppliedMark, SqlError>;
    /// Whether the database holds transactions executed ahead of the log.
    fn holds_ahead(&mut self) -> Result<bool, SqlError>;
    /// Replaces the database with a copy of `checkpoint` (or an empty one) standing at `mark`.
    fn restore(&mut self, checkpoint: Option<&Path>, mark: AppliedMark) -> Result<(), SqlError>;
    /// Whether the database's files may lack writes its last run made: the engine does not sync
    /// its own writes (the raft log is what is durable) and that run did not end with `close`.
    /// Such a database is rebuilt from the last checkpoint and the log before it serves.
    fn may_be_torn(&self) -> bool {
        false
    }
    /// The node is stopping: makes every write durable and records that the database stopped
    /// cleanly. Nothing may write to the database after it.
    fn close(&mut self) -> Result<(), SqlError> {
        Ok(())
    }
    /// Inside the open transaction: record its changes from here on, for `commit_recorded`
    /// (passive replication). Rolling back ends the recording.
    fn record_writes(&mut self) -> Result<(), SqlError>;
    /// Ends the open transaction, recorded since `record_writes`: rolled back if it changed
    /// nothing, else committed ahead of the log as `id` (`mark_ahead`) with its write-set. An
    /// error leaves it uncommitted (the caller rolls back).
    fn commit_recorded(&mut self, id: TxnId) -> Result<Recorded, SqlError>;
    /// Applies a write-set that `commit_recorded` gave on another node, in the write-set
    /// transaction (opened here if none is; no other transaction may be open). Any row that
    /// does not stand as the write-set expects is an error.
    fn apply_write_set(&mut self, write_set: &[u8]) -> Result<(), SqlError>;
    /// Ends the write-set transaction, if one is open: committed with the engine's state at
    /// `mark`, or (None) rolled back, changing nothing.
    fn end_write_sets(&mut self, mark: Option<AppliedMark>) -> Result<(), SqlError>;
    /// Whether the engine's sequences advance outside transactions (PostgreSQL's), so a
    /// checkpoint must record where they stand (`record_sequences`) and replicas be told
    /// (`sequence_settings`).
    fn sequences_outside_transactions(&self) -> bool {
        false
    }
    /// Outside a transaction, with none open: records in the database where each sequence
    /// stands, for a checkpoint of this state to carry (restored with it).
    fn record_sequences(&mut self) -> Result<(), SqlError> {
        Ok(())
    }
    /// Outside a transaction: statements that set each sequence to where it stands, for an
    /// engine whose sequences advance outside transactions (none for one whose do not).
    fn sequence_settings(&mut self) -> Result<Vec<Statement>, SqlError> {
        Ok(Vec::new())
    }
    /// Hybrid replication: ends the open transaction, recorded since `record_writes`, rolled
    /// back, and gives its write-set (empty if it changed nothing): the log applies it.
    fn take_write_set(&mut self) -> Result<Vec<u8>, SqlError> {
        Err(hybrid_unsupported())
    }
    /// Hybrid replication: applies a certified write-set as `apply_write_set` does, except that
    /// one that does not fit the rows (a row not as it expects, a constraint) is undone and
    /// its error returned inside `Ok`: on every node alike, it is void. The outer error is the
    /// engine's own failure.
    fn apply_certified_write_set(&mut self, _write_set: &[u8]) -> Result<Result<(), SqlError>, SqlError> {
        Err(hybrid_unsupported())
    }
    /// Hybrid replication: what certification remembers (see `certify`), as recorded.
    fn certified(&mut self) -> Result<Vec<Remembered>, SqlError> {
        Ok(Vec::new())
    }
    /// Hybrid replication, inside the open transaction (or write-set transaction): records
    /// what certification remembers now.
    fn record_certified(&mut self, _rows: &[Remembered]) -> Result<(), SqlError> {
        Err(hybrid_unsupported())
    }
    /// Hybrid replication, inside the open client transaction: applies a write-set of this
    /// node's still in the log (not recorded as the transaction's own; rows without a key take
    /// fresh rowids, as in log order).
    fn apply_in_transaction(&mut self, _write_set: &[u8]) -> Result<(), SqlError> {
        Err(hybrid_unsupported())
    }
    /// Whether `apply_in_transaction` is right for this schema: applying a write-set on the
    /// connection that executes would fire triggers and foreign-key actions again.
    fn applies_in_transaction(&mut self) -> bool {
        false
    }
    /// For the labeller (`classes::Schema`): a number that changes whenever the schema does.
    fn schema_version(&mut self) -> Option<u64> {
        None
    }
    /// For the labeller (`classes::Schema`): the columns, lower-cased, that an INSERT without
    /// a column list fills into `table`, in order.
    fn insert_columns(&mut self, _table: &str) -> Option<Vec<String>> {
        None
    }
}

impl Schema for Box<dyn Engine> {
    fn version(&mut self) -> Option<u64> {
        self.schema_version()
    }

    fn insert_columns(&mut self, table: &str) -> Option<Vec<String>> {
        Engine::insert_columns(&mut **self, table)
    }
}

fn hybrid_unsupported() -> SqlError {
    SqlError::unsupported("hybrid replication runs on the SQLite engine only (for now)".into())
}

/// SQLite, in WAL mode without an fsync per commit: the raft log is what is durable, and a
/// power cut leaves a consistent (older) database that the log brings forward.
pub struct Sqlite {
    dir: std::path::PathBuf,
    /// Declared before `conn`: the capture's hook is removed before its connection closes.
    recording: Option<Capture>,
    /// The captures' knowledge of the tables' columns.
    captured_tables: Arc<Mutex<crate::capture::Tables>>,
    conn: Connection,
    /// Applies other nodes' write-sets, with triggers and foreign-key actions off for good: a
    /// write-set holds what they did on the leader. (Switching them off and on around each
    /// write-set on `conn` would make SQLite re-prepare every statement it keeps.) Opened on
    /// the first write-set.
    applier: Option<Connection>,
    /// The applier's knowledge of the tables' columns.
    tables: crate::write_set::Tables,
    /// Whether write-sets may be applied on `conn` (`applies_in_transaction`), as of a schema
    /// version.
    applies_in_transaction: Option<(u64, bool)>,
    /// Certified write-sets are being applied in a transaction on `conn` (not the applier):
    /// where that is right, one connection both executes and applies, so neither finds its
    /// page cache stale after the other's commit.
    write_sets_on_conn: bool,
    random: Arc<AtomicU64>,
    /// See `Engine::may_be_torn`.
    may_be_torn: bool,
}

/// Present while the database's files are whole: written, synced, by `close`; removed, durably,
/// when the database is opened again, so a run that ends any other way leaves none.
const CLOSED_FILE: &str = "db.closed";

/// A file system error as SQLSTATE 58030 (io_error), saying what could not be done.
pub(crate) fn io_error(what: &str, e: std::io::Error) -> SqlError {
    SqlError::new("58030", format!("{what}: {e}"))
}

/// Whether `dir` holds the mark of a clean `close`; takes it away (durably) if so.
fn take_closed_mark(dir: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(dir.join(CLOSED_FILE)) {
        Ok(()) => std::fs::File::open(dir)?.sync_all().map(|()| true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// An error code of SQLite's C interface as an error of ours.
pub(crate) fn sqlite_code_error(what: &str, code: c_int) -> SqlError {
    SqlError::from_sqlite(&rusqlite::Error::SqliteFailure(
        ffi::Error::new(code),
        Some(format!("{what}: {}", ffi::code_to_str(code))),
    ))
}

/// The database file inside a node's SQL directory.
pub fn database_path(dir: &Path) -> std::path::PathBuf {
    dir.join("db.sqlite")
}

impl Sqlite {
    /// The net changes recorded since `record_writes` (empty if none); the recording ends.
    fn take_changeset(&mut self) -> Result<Vec<u8>, SqlError> {
        self.recording
            .take()
            .expect("writes are being recorded")
            .changeset(&self.conn)
    }

    pub fn open(dir: &Path) -> Result<Sqlite, SqlError> {
        std::fs::create_dir_all(dir).map_err(|e| io_error(&format!("cannot create {}", dir.display()), e))?;
        let existed = database_path(dir).exists();
        let closed = take_closed_mark(dir)
            .map_err(|e| io_error(&format!("cannot take the mark of a clean stop in {}", dir.display()), e))?;
        let conn = open_connection(dir, OpenFlags::default())?;
        // SQLite syncs nothing (synchronous = OFF): a COMMIT is durable once its entry is in
        // the raft log, fsynced on a majority, and a database whose run ended without `close`
        // is rebuilt from the last checkpoint and the log (`may_be_torn`), so a power cut that
        // tears its files loses nothing. Its syncs at every WAL checkpoint flushed the pages of
        // each commit to the device and held up the log's own appends (TPC-C ran 1.3-1.5x
        // slower with them: docs/benchmarks.md).
        // The WAL is checkpointed every 10,000 pages rather than SQLite's 1,000: pages a
        // workload rewrites often (TPC-C's district rows) are copied back once per checkpoint.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = OFF;
             PRAGMA foreign_keys = ON;
             PRAGMA wal_autocheckpoint = 10000;
             PRAGMA cache_size = -65536;
             PRAGMA mmap_size = 4294967296;
             PRAGMA temp_store = MEMORY;
             CREATE TABLE IF NOT EXISTS _chorus_applied (
                 only INTEGER PRIMARY KEY CHECK (only = 0),
                 log_index INTEGER NOT NULL,
                 command INTEGER NOT NULL,
                 txn_incarnation INTEGER NOT NULL,
                 txn_seq INTEGER NOT NULL);
             INSERT OR IGNORE INTO _chorus_applied VALUES (0, 0, 0, 0, 0);
             CREATE TABLE IF NOT EXISTS _chorus_ahead (
                 incarnation INTEGER NOT NULL,
                 seq INTEGER NOT NULL,
                 PRIMARY KEY (incarnation, seq));
             -- What hybrid certification remembers (`certify::Remembered`), by kind: 0 a class
             -- (name) and its Touch (a, b: last position; c: by; d, e: before); 1 the last
             -- global commit (a, b); 2 the last commit of any kind, as a Touch; 3 an executing
             -- node's Chain (name: its incarnation; a: last_seq; b: committed).
             CREATE TABLE IF NOT EXISTS _chorus_certified (
                 kind INTEGER NOT NULL,
                 name TEXT NOT NULL,
                 a INTEGER NOT NULL,
                 b INTEGER NOT NULL,
                 c INTEGER NOT NULL,
                 d INTEGER NOT NULL,
                 e INTEGER NOT NULL,
                 PRIMARY KEY (kind, name));",
        )
        .map_err(|e| SqlError::from_sqlite(&e))?;
        let random = Arc::new(AtomicU64::new(0));
        register_seeded_functions(&conn, &random).map_err(|e| SqlError::from_sqlite(&e))?;
        Ok(Sqlite {
            dir: dir.to_path_buf(),
            recording: None,
            captured_tables: Default::default(),
            conn,
            applier: None,
            tables: Default::default(),
            applies_in_transaction: None,
            write_sets_on_conn: false,
            random,
            may_be_torn: existed && !closed,
        })
    }

    fn open_applier(&mut self) -> Result<(), SqlError> {
        if self.applier.is_none() {
            let applier = open_connection(&self.dir, OpenFlags::default())?;
            applier
                .execute_batch(
                    "PRAGMA synchronous = OFF;
                     PRAGMA foreign_keys = OFF;
                     PRAGMA wal_autocheckpoint = 10000;
                     PRAGMA cache_size = -65536;
                     PRAGMA mmap_size = 4294967296;
                     PRAGMA temp_store = MEMORY;",
                )
                .and_then(|()| applier.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false))
                .map_err(|e| SqlError::from_sqlite(&e))?;
            self.applier = Some(applier);
        }
        Ok(())
    }

    /// Whether the applier has no transaction open.
    fn applier_idle(&self) -> bool {
        self.applier.as_ref().is_none_or(Connection::is_autocommit)
    }

    /// Opens the write-set transaction on the applier, if none is open.
    fn open_write_sets(&mut self) -> Result<(), SqlError> {
        assert!(
            self.conn.is_autocommit(),
            "write-sets apply with no other transaction open"
        );
        self.open_applier()?;
        let applier = self.applier.as_ref().expect("opened above");
        if applier.is_autocommit() {
            bookkeep(applier, "BEGIN IMMEDIATE", [])?;
        }
        Ok(())
    }

    fn bookkeep(&self, sql: &str, params: impl rusqlite::Params) -> Result<(), SqlError> {
        bookkeep(&self.conn, sql, params)
    }

    /// Removes the database files so the next `open` starts empty.
    pub fn remove(dir: &Path) -> std::io::Result<()> {
        let db = database_path(dir);
        for suffix in ["", "-wal", "-shm"] {
            let mut path = db.clone().into_os_string();
            path.push(suffix);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

/// One statement of Chorus's own bookkeeping on `conn`. Every transaction runs some, on every
/// node: they are parsed once and kept prepared.
fn bookkeep(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> Result<(), SqlError> {
    conn.prepare_cached(sql)
        .and_then(|mut statement| statement.execute(params))
        .map(drop)
        .map_err(|e| SqlError::from_sqlite(&e))
}

const MARK_APPLIED: &str =
    "UPDATE _chorus_applied SET log_index = ?1, command = ?2, txn_incarnation = ?3, txn_seq = ?4";

fn mark_params(mark: AppliedMark) -> (i64, u32, i64, i64) {
    (
        mark.log_index as i64,
        mark.command,
        mark.last_txn.incarnation as i64,
        mark.last_txn.seq as i64,
    )
}

/// A read-only connection to the same database, for reads off the node's thread.
pub fn open_reader(dir: &Path) -> Result<Connection, SqlError> {
    let conn = open_connection(dir, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.execute_batch("PRAGMA query_only = ON; PRAGMA mmap_size = 4294967296;")
        .map_err(|e| SqlError::from_sqlite(&e))?;
    Ok(conn)
}

/// SplitMix64: one step from `state`.
fn next_random(state: &AtomicU64) -> u64 {
    let mut z = state
        .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `random()`, `randomblob(n)` and `gen_random_uuid()` drawn from the writer's seed, so every
/// replica draws the same values.
fn register_seeded_functions(conn: &Connection, random: &Arc<AtomicU64>) -> rusqlite::Result<()> {
    let flags = FunctionFlags::SQLITE_UTF8;
    let state = random.clone();
    conn.create_scalar_function("random", 0, flags, move |_| Ok(next_random(&state) as i64))?;
    let state = random.clone();
    conn.create_scalar_function("randomblob", 1, flags, move |ctx| {
        let len = ctx.get::<i64>(0)?.clamp(1, 1 << 20) as usize;
        let mut blob = Vec::with_capacity(len + 8);
        while blob.len() < len {
            blob.extend_from_slice(&next_random(&state).to_le_bytes());
        }
        blob.truncate(len);
        Ok(blob)
    })?;
    let state = random.clone();
    conn.create_scalar_function("gen_random_uuid", 0, flags, move |_| {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&next_random(&state).to_le_bytes());
        bytes[8..].copy_from_slice(&next_random(&state).to_le_bytes());
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Ok(uuid_text(&bytes))
    })?;
    Ok(())
}

/// A UUID's 16 bytes in its text form (`8-4-4-4-12` hex digits).
pub(crate) fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(t) => ValueRef::Text(t.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn value_of(value: ValueRef) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

/// The result columns of `statement`, prepared from `sql`.
pub fn columns_of(statement: &rusqlite::Statement, sql: &str) -> Vec<Column> {
    // Only a column without a declared type needs its computing function (a text scan).
    let untyped = statement.columns().any(|c| c.decl_type().is_none());
    let mut functions = if untyped {
        crate::text::select_item_functions(sql)
    } else {
        Vec::new()
    };
    if functions.len() != statement.column_count() {
        functions.clear();
    }
    statement
        .columns()
        .enumerate()
        .map(|(i, c)| Column {
            name: c.name().to_owned(),
            declared: c.decl_type().map(str::to_owned),
            function: functions.get(i).cloned().flatten(),
        })
        .collect()
}

/// A connection to the database in `dir`, keeping statements prepared, with the query
/// planner's stability guarantee (QPSG): a statement's plan does not depend on the values bound
/// to it. Without it SQLite marks a statement whose plan looked at a bound value (an equality
/// the index does not use, a LIKE pattern, a LIMIT) to be planned again once that value is
/// rebound — and the statement cache clears the bindings of every statement returned to it,
/// so TPC-C's customer and new-order lookups were compiled afresh at every execution (2.3% of
/// a hybrid node's CPU). Plans that only a value could improve (an index for `LIKE ?` with a
/// prefix) are given up for that.
fn open_connection(dir: &Path, flags: OpenFlags) -> Result<Connection, SqlError> {
    let conn = Connection::open_with_flags(database_path(dir), flags).map_err(|e| SqlError::from_sqlite(&e))?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(|e| SqlError::from_sqlite(&e))?;
    conn.set_prepared_statement_cache_capacity(PREPARED_STATEMENTS_PER_CONNECTION);
    Ok(conn)
}

/// Statements longer than this are prepared for one run only.
const PREPARED_MAX_STATEMENT_BYTES: usize = 4096;
/// Prepared statements kept per connection.
pub const PREPARED_STATEMENTS_PER_CONNECTION: usize = 512;

enum Prepared<'conn> {
    Cached(rusqlite::CachedStatement<'conn>),
    Once(rusqlite::Statement<'conn>),
}

impl<'conn> Prepared<'conn> {
    fn get(&mut self) -> &mut rusqlite::Statement<'conn> {
        match self {
            Prepared::Cached(statement) => statement,
            Prepared::Once(statement) => statement,
        }
    }
}

/// Runs one statement on `conn` and collects what it gave.
pub fn run(conn: &Connection, sql: &str, params: &[Value]) -> Result<Outcome, SqlError> {
    // Statements a client repeats stay prepared; long one-off ones (bulk loads) would only
    // push those out.
    let statement = if sql.len() <= PREPARED_MAX_STATEMENT_BYTES {
        conn.prepare_cached(sql).map(Prepared::Cached)
    } else {
        conn.prepare(sql).map(Prepared::Once)
    };
    let mut statement = statement.map_err(|e| SqlError::from_sqlite(&e))?;
    let statement = statement.get();
    let expected = statement.parameter_count();
    if params.len() != expected {
        return Err(SqlError::new(
            "08P01",
            format!("the statement takes {expected} parameters, {} were bound", params.len()),
        ));
    }
    let read_only = statement.readonly();
    let columns = columns_of(statement, sql);
    let mut rows = Vec::new();
    if columns.is_empty() {
        statement
            .execute(rusqlite::params_from_iter(params))
            .map_err(|e| SqlError::from_sqlite(&e))?;
    } else {
        let mut cursor = statement
            .query(rusqlite::params_from_iter(params))
            .map_err(|e| SqlError::from_sqlite(&e))?;
        while let Some(row) = cursor.next().map_err(|e| SqlError::from_sqlite(&e))? {
            rows.push(
                (0..columns.len())
                    .map(|i| row.get_ref(i).map(value_of))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| SqlError::from_sqlite(&e))?,
            );
        }
    }
    Ok(Outcome {
        changes: if read_only { 0 } else { conn.changes() },
        columns,
        rows,
        read_only,
    })
}

impl Engine for Sqlite {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn begin(&mut self) -> Result<(), SqlError> {
        self.bookkeep("BEGIN IMMEDIATE", [])
    }

    fn commit(&mut self) -> Result<(), SqlError> {
        self.recording = None;
        self.bookkeep("COMMIT", [])
    }

    fn rollback(&mut self) {
        self.recording = None;
        self.write_sets_on_conn = false;
        if !self.conn.is_autocommit() {
            // Kept prepared, as COMMIT is: a hybrid node rolls back every transaction it runs.
            self.bookkeep("ROLLBACK", [])
                .expect("SQLite rolls back an open transaction");
        }
    }

    fn seed(&mut self, seed: u64) {
        self.random.store(seed, Ordering::Relaxed);
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<Outcome, SqlError> {
        run(&self.conn, sql, params)
    }

    fn mark_applied(&mut self, mark: AppliedMark) -> Result<(), SqlError> {
        self.bookkeep(MARK_APPLIED, mark_params(mark))
    }

    fn mark_ahead(&mut self, id: TxnId) -> Result<(), SqlError> {
        self.bookkeep(
            "INSERT INTO _chorus_ahead VALUES (?1, ?2)",
            (id.incarnation as i64, id.seq as i64),
        )
    }

    fn clear_ahead(&mut self, id: TxnId) -> Result<(), SqlError> {
        self.bookkeep(
            "DELETE FROM _chorus_ahead WHERE incarnation = ?1 AND seq = ?2",
            (id.incarnation as i64, id.seq as i64),
        )
    }

    fn applied(&mut self) -> Result<AppliedMark, SqlError> {
        self.conn
            .query_row(
                "SELECT log_index, command, txn_incarnation, txn_seq FROM _chorus_applied",
                (),
                |row| {
                    Ok(AppliedMark {
                        log_index: row.get::<_, i64>(0)? as u64,
                        command: row.get(1)?,
                        last_txn: TxnId {
                            incarnation: row.get::<_, i64>(2)? as u64,
                            seq: row.get::<_, i64>(3)? as u64,
                        },
                    })
                },
            )
            .map_err(|e| SqlError::from_sqlite(&e))
    }

    fn restore(&mut self, checkpoint: Option<&Path>, mark: AppliedMark) -> Result<(), SqlError> {
        // Close the database before its files are replaced.
        self.recording = None;
        self.applier = None;
        self.tables = Default::default();
        self.conn = Connection::open_in_memory().map_err(|e| SqlError::from_sqlite(&e))?;
        Sqlite::remove(&self.dir).map_err(|e| io_error("cannot remove the database", e))?;
        if let Some(checkpoint) = checkpoint {
            let db = database_path(&self.dir);
            std::fs::copy(checkpoint, &db).map_err(|e| io_error("cannot copy the checkpoint", e))?;
        }
        *self = Sqlite::open(&self.dir)?;
        // This copy is the rebuild; should this run end without `close`, the next one rebuilds
        // again (no mark).
        self.may_be_torn = false;
        self.begin()?;
        let restored = self
            .conn
            .execute_batch("DELETE FROM _chorus_ahead")
            .map_err(|e| SqlError::from_sqlite(&e))
            .and_then(|()| self.mark_applied(mark));
        if let Err(e) = restored {
            self.rollback();
            return Err(e);
        }
        self.commit()
    }

    fn may_be_torn(&self) -> bool {
        self.may_be_torn
    }

    fn close(&mut self) -> Result<(), SqlError> {
        if !self.conn.is_autocommit() || self.applier.as_ref().is_some_and(|applier| !applier.is_autocommit()) {
            return Err(SqlError::new("55000", "a transaction is open on the database"));
        }
        // Every committed page into the database file and the WAL emptied, so that closing
        // the connections writes nothing more.
        let busy: i64 = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", (), |row| row.get(0))
            .map_err(|e| SqlError::from_sqlite(&e))?;
        if busy != 0 {
            return Err(SqlError::new("55006", "a reader kept the WAL from being checkpointed"));
        }
        let db = database_path(&self.dir);
        let mut wal = db.clone().into_os_string();
        wal.push("-wal");
        for path in [db.as_os_str(), wal.as_os_str()] {
            match std::fs::File::open(path) {
                Ok(file) => file.sync_all().map_err(|e| io_error("cannot sync the database", e))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("cannot open the database to sync it", e)),
            }
        }
        std::fs::File::create(self.dir.join(CLOSED_FILE))
            .and_then(|file| file.sync_all())
            .and_then(|()| std::fs::File::open(&self.dir)?.sync_all())
            .map_err(|e| io_error("cannot mark the database closed", e))
    }

    fn holds_ahead(&mut self) -> Result<bool, SqlError> {
        self.conn
            .query_row("SELECT EXISTS (SELECT 1 FROM _chorus_ahead)", (), |row| {
                row.get::<_, bool>(0)
            })
            .map_err(|e| SqlError::from_sqlite(&e))
    }

    fn record_writes(&mut self) -> Result<(), SqlError> {
        assert!(self.recording.is_none(), "one recording per transaction");
        let schema_version = self
            .schema_version()
            .ok_or_else(|| SqlError::new("XX000", "cannot read the schema version"))?;
        // SAFETY: the connection is this engine's, with no other pre-update hook (no session
        // is ever made on it); `recording` is declared before `conn`, so the capture ends
        // before the connection closes, and both move together.
        let capture = unsafe { Capture::start(self.conn.handle(), self.captured_tables.clone(), schema_version) };
        self.recording = Some(capture);
        Ok(())
    }

    fn commit_recorded(&mut self, id: TxnId) -> Result<Recorded, SqlError> {
        let write_set = self.take_changeset()?;
        if write_set.is_empty() {
            self.rollback();
            return Ok(Recorded::Nothing);
        }
        self.mark_ahead(id)?;
        self.commit()?;
        Ok(Recorded::WriteSet(write_set))
    }

    fn take_write_set(&mut self) -> Result<Vec<u8>, SqlError> {
        let write_set = self.take_changeset();
        self.rollback();
        write_set
    }

    fn apply_certified_write_set(&mut self, write_set: &[u8]) -> Result<Result<(), SqlError>, SqlError> {
        let on_conn = self.write_sets_on_conn || (self.applier_idle() && self.applies_in_transaction());
        let applier = if on_conn {
            if self.conn.is_autocommit() {
                self.bookkeep("BEGIN IMMEDIATE", [])?;
                self.write_sets_on_conn = true;
            }
            &self.conn
        } else {
            self.open_write_sets()?;
            self.applier.as_ref().expect("opened above")
        };
        bookkeep(applier, "SAVEPOINT certified", [])?;
        let applied = crate::write_set::apply(applier, &mut self.tables, write_set, true);
        if let Err(e) = &applied {
            if !e.is_conflict() {
                return Err(applied.unwrap_err());
            }
            bookkeep(applier, "ROLLBACK TO certified", [])?;
        }
        bookkeep(applier, "RELEASE certified", [])?;
        Ok(applied)
    }

    fn certified(&mut self) -> Result<Vec<Remembered>, SqlError> {
        let mut statement = self
            .conn
            .prepare("SELECT kind, name, a, b, c, d, e FROM _chorus_certified")
            .map_err(|e| SqlError::from_sqlite(&e))?;
        let rows = statement
            .query_map((), |row| {
                let n = |i: usize| row.get::<_, i64>(i);
                let position = |i: usize| Ok::<_, rusqlite::Error>((n(i)? as u64, n(i + 1)? as u32));
                let touch = || {
                    Ok::<_, rusqlite::Error>(Touch {
                        last: position(2)?,
                        by: n(4)? as u64,
                        before: (n(5)? as u64, n(6)? as u32),
                    })
                };
                Ok(match n(0)? {
                    0 => Remembered::Class(row.get(1)?, touch()?),
                    1 => Remembered::Global(position(2)?),
                    2 => Remembered::Any(touch()?),
                    _ => Remembered::Chain(
                        row.get::<_, String>(1)?.parse().map_err(|e| {
                            rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e))
                        })?,
                        Chain {
                            last_seq: n(2)? as u64,
                            committed: n(3)? as u64,
                        },
                    ),
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| SqlError::from_sqlite(&e))?;
        Ok(rows)
    }

    fn record_certified(&mut self, rows: &[Remembered]) -> Result<(), SqlError> {
        // The applier's write-set transaction, if one is open, else `conn`'s.
        let conn = self
            .applier
            .as_ref()
            .filter(|applier| !applier.is_autocommit())
            .unwrap_or(&self.conn);
        let touch = |t: &Touch| {
            [
                t.last.0 as i64,
                i64::from(t.last.1),
                t.by as i64,
                t.before.0 as i64,
                i64::from(t.before.1),
            ]
        };
        for row in rows {
            let (kind, name, values) = match row {
                Remembered::Class(class, t) => (0, class.clone(), touch(t)),
                Remembered::Global(at) => (1, String::new(), [at.0 as i64, i64::from(at.1), 0, 0, 0]),
                Remembered::Any(t) => (2, String::new(), touch(t)),
                Remembered::Chain(incarnation, chain) => (
                    3,
                    incarnation.to_string(),
                    [chain.last_seq as i64, chain.committed as i64, 0, 0, 0],
                ),
            };
            let [a, b, c, d, e] = values;
            bookkeep(
                conn,
                "INSERT OR REPLACE INTO _chorus_certified VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                (kind, name, a, b, c, d, e),
            )?;
        }
        Ok(())
    }

    fn apply_in_transaction(&mut self, write_set: &[u8]) -> Result<(), SqlError> {
        assert!(!self.conn.is_autocommit(), "applied inside the open transaction");
        // Not the transaction's own writes: the recording, if one runs, skips them.
        if let Some(capture) = &mut self.recording {
            capture.set_recording(false);
        }
        // A chain's rows without a key take fresh rowids too: others' write-sets applied since
        // it ran may hold the ones it drew.
        let applied = crate::write_set::apply(&self.conn, &mut self.tables, write_set, true);
        if let Some(capture) = &mut self.recording {
            capture.set_recording(true);
        }
        applied
    }

    fn applies_in_transaction(&mut self) -> bool {
        let Some(version) = self.schema_version() else {
            return false;
        };
        if let Some((known, applies)) = self.applies_in_transaction {
            if known == version {
                return applies;
            }
        }
        // No trigger, and no foreign key that acts on a change.
        let applies = self
            .conn
            .query_row(
                "SELECT NOT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger') \
                 AND NOT EXISTS (SELECT 1 FROM sqlite_master AS t, pragma_foreign_key_list(t.name) AS f \
                                 WHERE t.type = 'table' AND (f.on_update <> 'NO ACTION' OR f.on_delete <> 'NO ACTION'))",
                [],
                |row| row.get::<_, bool>(0),
            )
            .unwrap_or(false);
        self.applies_in_transaction = Some((version, applies));
        applies
    }

    fn schema_version(&mut self) -> Option<u64> {
        crate::table_columns::schema_version(&self.conn).ok()
    }

    fn insert_columns(&mut self, table: &str) -> Option<Vec<String>> {
        let columns: Vec<String> = crate::table_columns::read(&self.conn, table)
            .ok()?
            .into_iter()
            .filter(|column| !column.hidden)
            .map(|column| column.name.to_ascii_lowercase())
            .collect();
        (!columns.is_empty()).then_some(columns)
    }

    fn apply_write_set(&mut self, write_set: &[u8]) -> Result<(), SqlError> {
        self.open_write_sets()?;
        let applier = self.applier.as_ref().expect("opened above");
        crate::write_set::apply(applier, &mut self.tables, write_set, false)
    }

    fn end_write_sets(&mut self, mark: Option<AppliedMark>) -> Result<(), SqlError> {
        if self.write_sets_on_conn {
            self.write_sets_on_conn = false;
            return match mark {
                Some(mark) => self.mark_applied(mark).and_then(|()| self.commit()),
                None => {
                    self.rollback();
                    Ok(())
                }
            };
        }
        let Some(applier) = self.applier.as_ref().filter(|applier| !applier.is_autocommit()) else {
            return Ok(());
        };
        match mark {
            Some(mark) => {
                bookkeep(applier, MARK_APPLIED, mark_params(mark)).and_then(|()| bookkeep(applier, "COMMIT", []))
            }
            None => {
                applier
                    .execute_batch("ROLLBACK")
                    .expect("SQLite rolls back an open transaction");
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_kept_prepared_is_not_compiled_again_for_other_values() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Sqlite::open(dir.path()).unwrap();
        engine
            .conn
            .execute_batch(
                "CREATE TABLE warehouse (w_id INTEGER PRIMARY KEY, w_tax REAL);
                 CREATE TABLE customer (c_w_id INTEGER, c_d_id INTEGER, c_id INTEGER, c_last TEXT,
                     PRIMARY KEY (c_w_id, c_d_id, c_id));
                 INSERT INTO warehouse VALUES (1, 0.1), (2, 0.2);
                 INSERT INTO customer VALUES (1, 1, 1, 'a'), (2, 1, 1, 'b'), (2, 3, 1, 'c');",
            )
            .unwrap();
        // TPC-C's lookups: an equality the index does not use, and ORDER BY … LIMIT.
        let statements = [
            "SELECT c_last, w_tax FROM customer, warehouse WHERE w_id = ?1 AND c_w_id = w_id AND c_d_id = ?2 AND c_id = ?3",
            "SELECT c_id FROM customer WHERE c_w_id = ?1 AND c_d_id = ?2 AND c_id >= ?3 ORDER BY c_last LIMIT 1",
        ];
        for sql in statements {
            for round in 0..6 {
                let values = [1 + round % 2, 1 + round % 3, 1].map(Value::Integer);
                run(&engine.conn, sql, &values).unwrap();
            }
            let prepared = engine.conn.prepare_cached(sql).unwrap();
            assert_eq!(prepared.get_status(rusqlite::StatementStatus::RePrepare), 0, "{sql}");
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_random_values() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Sqlite::open(&dir.path().join("a")).unwrap();
        let mut b = Sqlite::open(&dir.path().join("b")).unwrap();
        let draw = |engine: &mut Sqlite| {
            engine.seed(42);
            engine
                .execute("SELECT random(), hex(randomblob(5)), gen_random_uuid()", &[])
                .unwrap()
                .rows
        };
        let drawn = draw(&mut a);
        assert_eq!(drawn, draw(&mut b));
        assert_ne!(drawn, {
            a.seed(43);
            a.execute("SELECT random(), hex(randomblob(5)), gen_random_uuid()", &[])
                .unwrap()
                .rows
        });
    }

    #[test]
    fn the_labeller_places_an_insert_without_columns_by_the_tables_columns_as_they_stand() {
        let dir = tempfile::tempdir().unwrap();
        let mut engine: Box<dyn Engine> = Box::new(Sqlite::open(dir.path()).unwrap());
        let mut labeller = crate::classes::Labeller::new("stock.s_w_id".parse().unwrap());
        let insert = "INSERT INTO stock VALUES (?1, ?2)";
        let params = [Value::Integer(4), Value::Integer(9)];
        let mut label =
            |engine: &mut Box<dyn Engine>| labeller.label(insert, crate::text::StatementKind::Write, &params, engine);
        assert!(label(&mut engine).global, "no table yet");
        // A generated column takes no value from an INSERT, wherever it stands.
        engine
            .execute(
                "CREATE TABLE stock (s_double INTEGER AS (s_i_id * 2), s_i_id INTEGER, \"S_W_ID\" INTEGER)",
                &[],
            )
            .unwrap();
        assert_eq!(label(&mut engine).classes.into_iter().collect::<Vec<_>>(), ["9"]);
        engine.execute("DROP TABLE stock", &[]).unwrap();
        engine
            .execute("CREATE TABLE stock (s_w_id INTEGER, s_i_id INTEGER)", &[])
            .unwrap();
        assert_eq!(label(&mut engine).classes.into_iter().collect::<Vec<_>>(), ["4"]);
        engine.execute(insert, &params).unwrap();
        assert_eq!(
            engine.execute("SELECT s_w_id FROM stock", &[]).unwrap().rows,
            [[Value::Integer(4)]]
        );
    }

    #[test]
    fn the_applied_mark_and_ahead_rows_commit_with_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Sqlite::open(dir.path()).unwrap();
        engine.execute("CREATE TABLE t (a INTEGER)", &[]).unwrap();
        let id = TxnId { incarnation: 1, seq: 1 };
        engine.begin().unwrap();
        engine
            .execute("INSERT INTO t VALUES (?1)", &[Value::Integer(5)])
            .unwrap();
        engine.mark_ahead(id).unwrap();
        engine
            .mark_applied(AppliedMark {
                log_index: 9,
                command: 2,
                last_txn: id,
            })
            .unwrap();
        engine.rollback();
        assert!(!engine.holds_ahead().unwrap());
        assert_eq!(engine.applied().unwrap(), AppliedMark::default());
        engine.begin().unwrap();
        engine.mark_ahead(id).unwrap();
        engine.commit().unwrap();
        drop(engine);
        let mut reopened = Sqlite::open(dir.path()).unwrap();
        assert!(reopened.holds_ahead().unwrap());
        reopened.begin().unwrap();
        let mark = AppliedMark {
            log_index: 9,
            command: 2,
            last_txn: id,
        };
        reopened.mark_applied(mark).unwrap();
        reopened.commit().unwrap();
        assert_eq!(reopened.applied().unwrap(), mark);
        assert!(mark.covers(9, 2) && mark.covers(8, 7) && !mark.covers(9, 3) && !mark.covers(10, 0));
    }

    #[test]
    fn only_a_database_closed_by_its_last_run_is_trusted_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Sqlite::open(dir.path()).unwrap();
        assert!(!engine.may_be_torn(), "a new database has nothing to lose");
        engine.execute("CREATE TABLE t (a INTEGER)", &[]).unwrap();
        engine.begin().unwrap();
        engine.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
        assert!(engine.close().is_err(), "closed with a transaction open");
        engine.commit().unwrap();
        // A run that ends without `close` (a crash, a power cut) leaves no mark.
        drop(engine);
        let mut engine = Sqlite::open(dir.path()).unwrap();
        assert!(engine.may_be_torn());
        engine.close().unwrap();
        assert!(dir.path().join(CLOSED_FILE).exists());
        drop(engine);
        let mut engine = Sqlite::open(dir.path()).unwrap();
        assert!(!engine.may_be_torn());
        assert!(
            !dir.path().join(CLOSED_FILE).exists(),
            "the mark is taken when the database opens"
        );
        let rows = engine.execute("SELECT a FROM t", &[]).unwrap().rows;
        assert_eq!(rows, vec![vec![Value::Integer(1)]]);
        drop(engine);
        // The mark was for one run only.
        assert!(Sqlite::open(dir.path()).unwrap().may_be_torn());
    }
}
