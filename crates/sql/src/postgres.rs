//! PostgreSQL as the engine: each node replicates into a PostgreSQL server of its own (started
//! beside it by `chorus cluster start --sql-engine postgres`), reached over PostgreSQL's own
//! protocol. The database's code is untouched: Chorus is a client like any other.
//!
//! Every connection is a blocking one (`pg_blocking`): the writer's, on the node's thread,
//! waits for each reply as it waits for SQLite's (handing statements to another thread and back
//! cost more than the statements); readers run off the node's thread, as SQLite's do.
//!
//! Parameters travel in text form, so a value is read by the type the server expects; results
//! arrive in binary and are decoded here for the types a replicated schema uses (others are
//! refused by name: cast them to text).

use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;
/// PostgreSQL's types, as `decode` takes them.
pub use tokio_postgres::types::Type;
use tokio_postgres::types::{Format, FromSql, IsNull, ToSql};

use crate::database::CheckpointCopy;
use crate::engine::{AppliedMark, Column, Engine, Outcome, Recorded};
use crate::error::SqlError;
use crate::pg_blocking::{self, Target};
use crate::pg_decoding;
use crate::pg_write_set::{self, Datum, Line, Table, TableInfo};
use crate::text::{Dialect, StatementKind};
use crate::txn::{Statement as Logged, TxnId, Value};

/// Prepared statements kept per connection; the cache starts over when full.
const PREPARED_PER_CONNECTION: usize = 512;
/// Statements longer than this are never prepared (bulk loads).
const PREPARED_MAX_STATEMENT_BYTES: usize = 4096;

/// A node's PostgreSQL server: how to reach it, and its client programs.
pub struct PgServer {
    conninfo: String,
    config: tokio_postgres::Config,
    /// Where `pg_dump` and `pg_restore` are.
    bin_dir: PathBuf,
}

impl PgServer {
    /// A server reached by `conninfo` (`host=… port=… user=… dbname=…`); its client programs
    /// (`pg_dump`, `pg_restore`) in `bin_dir`.
    pub fn new(conninfo: &str, bin_dir: PathBuf) -> Result<Arc<PgServer>, SqlError> {
        let config: tokio_postgres::Config = conninfo
            .parse()
            .map_err(|e| SqlError::new("08001", format!("invalid PostgreSQL connection string: {e}")))?;
        Ok(Arc::new(PgServer {
            conninfo: conninfo.to_owned(),
            config,
            bin_dir,
        }))
    }

    fn program(&self, name: &str) -> Command {
        Command::new(self.bin_dir.join(name))
    }
}

/// The SQLSTATE of a PostgreSQL error, kept for the process's life (codes are few).
pub(crate) fn intern_code(code: &str) -> &'static str {
    static CODES: OnceLock<Mutex<Vec<&'static str>>> = OnceLock::new();
    let mut codes = CODES.get_or_init(Default::default).lock().expect("never poisoned");
    if let Some(known) = codes.iter().find(|c| **c == code) {
        return known;
    }
    let leaked: &'static str = Box::leak(code.into());
    codes.push(leaked);
    leaked
}

/// A statement and its parameters, to run without reading its results.
type Unread = (String, Vec<Value>);

fn target<'a>(prepared: &'a Option<pg_blocking::Prepared>, sql: &'a str) -> Target<'a> {
    match prepared {
        Some(statement) => Target::Prepared(statement),
        None => Target::Once(sql),
    }
}

/// Each statement as what to execute (`prepared` from `Session::prepare_all`) with its parameters.
fn targets<'a>(
    statements: &'a [Unread],
    prepared: &'a [Option<pg_blocking::Prepared>],
) -> Vec<(Target<'a>, &'a [Value])> {
    statements
        .iter()
        .zip(prepared)
        .map(|((sql, params), prepared)| (target(prepared, sql), params.as_slice()))
        .collect()
}

/// Whether `text` holds `word`, in any case, without copying it (on every statement's path).
fn mentions(text: &str, word: &str) -> bool {
    text.as_bytes()
        .windows(word.len())
        .any(|window| window.eq_ignore_ascii_case(word.as_bytes()))
}

/// A connection and its prepared statements: a text is prepared the second time it comes
/// (one-off texts, with their values written in, run unprepared, parsed in the same round trip).
struct Session {
    conn: pg_blocking::Connection,
    prepared: HashMap<String, pg_blocking::Prepared>,
    seen_once: HashSet<String>,
}

impl Session {
    /// A session with `options` (`-c name=value …`); every session reads time in UTC.
    fn open(server: &PgServer, options: &str) -> Result<Session, SqlError> {
        Ok(Session {
            conn: pg_blocking::Connection::connect(&server.config, &format!("-c TimeZone=UTC {options}"))?,
            prepared: HashMap::new(),
            seen_once: HashSet::new(),
        })
    }

    /// Makes room for `count` more prepared statements: when the cache would overflow, every
    /// statement is dropped, here and on the server. Never between preparing a statement and
    /// executing it.
    fn make_room(&mut self, count: usize) -> Result<(), SqlError> {
        if self.prepared.len() + count > PREPARED_PER_CONNECTION {
            self.forget_prepared()?;
        }
        if self.seen_once.len() + count > PREPARED_PER_CONNECTION {
            self.seen_once.clear();
        }
        Ok(())
    }

    /// The statement prepared if its text came before (and is not long), else None: run it once.
    fn prepared_for(&mut self, sql: &str) -> Result<Option<pg_blocking::Prepared>, SqlError> {
        if let Some(statement) = self.prepared.get(sql) {
            return Ok(Some(statement.clone()));
        }
        if sql.len() > PREPARED_MAX_STATEMENT_BYTES || self.seen_once.insert(sql.to_owned()) {
            return Ok(None);
        }
        self.seen_once.remove(sql);
        let statement = self.conn.prepare(sql)?;
        self.prepared.insert(sql.to_owned(), statement.clone());
        Ok(Some(statement))
    }

    /// Drops every prepared statement, here and on the server.
    fn forget_prepared(&mut self) -> Result<(), SqlError> {
        self.prepared.clear();
        self.conn.batch("DEALLOCATE ALL")
    }

    /// Runs `sql` after the statements of `prefix` (their results dropped) in one round trip,
    /// and collects what it gave.
    fn run(&mut self, prefix: &[Unread], sql: &str, params: &[Value]) -> Result<Outcome, SqlError> {
        self.make_room(1 + prefix.len())?;
        let statement = self.prepared_for(sql)?;
        if let Some(statement) = &statement {
            let expected = statement.params.len();
            if params.len() != expected {
                return Err(SqlError::new(
                    "08P01",
                    format!("the statement takes {expected} parameters, {} were bound", params.len()),
                ));
            }
        }
        let prefix_prepared = self.prepare_all(prefix)?;
        let executed = self
            .conn
            .execute(&targets(prefix, &prefix_prepared), target(&statement, sql), params)?;
        let columns = match (&statement, executed.columns) {
            (Some(statement), _) => statement.columns.clone(),
            (None, Some(described)) => described,
            (None, None) => Vec::new(),
        };
        Ok(Outcome {
            columns: columns_of(columns),
            rows: executed.rows,
            changes: executed.changes,
            read_only: reads_only(sql),
        })
    }

    /// Sends every statement in one round trip, reading only the rows each changed.
    fn pipeline(&mut self, all: &[Unread]) -> Result<Vec<u64>, SqlError> {
        self.make_room(all.len())?;
        let prepared = self.prepare_all(all)?;
        self.conn.execute_pipelined(&targets(all, &prepared))
    }

    /// `prepared_for` each statement (room made first).
    fn prepare_all(&mut self, statements: &[Unread]) -> Result<Vec<Option<pg_blocking::Prepared>>, SqlError> {
        statements.iter().map(|(sql, _)| self.prepared_for(sql)).collect()
    }

    /// The columns `sql` returns (it stays prepared: a statement described is run next).
    fn describe(&mut self, sql: &str) -> Result<Vec<Column>, SqlError> {
        self.make_room(1)?;
        if !self.prepared.contains_key(sql) {
            let statement = self.conn.prepare(sql)?;
            self.prepared.insert(sql.to_owned(), statement);
        }
        Ok(columns_of(self.prepared[sql].columns.clone()))
    }
}

fn columns_of(columns: Vec<(String, Type)>) -> Vec<Column> {
    columns
        .into_iter()
        .map(|(name, ty)| Column {
            name,
            declared: Some(ty.name().to_owned()),
            function: None,
        })
        .collect()
}

/// Whether a statement cannot have changed the database, from its text: a plain query. (A
/// query calling a function that writes is taken as a read: under the PostgreSQL engine such
/// calls are not replicated; see docs/sql.md.)
fn reads_only(sql: &str) -> bool {
    crate::text::classify_unkept(sql) == Ok(StatementKind::Read)
        && !mentions(sql, "nextval")
        && !mentions(sql, "setval")
}

/// A parameter in text form: the server reads it as the type it expects there.
#[derive(Debug)]
pub(crate) struct Param<'a>(pub(crate) &'a Value);

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        let text = match self.0 {
            Value::Null => return Ok(IsNull::Yes),
            Value::Integer(i) => i.to_string(),
            Value::Real(f) => f.to_string(),
            Value::Text(t) => {
                out.extend_from_slice(t.as_bytes());
                return Ok(IsNull::No);
            }
            Value::Blob(b) if *ty == Type::BYTEA => {
                let mut hex = String::with_capacity(2 + 2 * b.len());
                hex.push_str("\\x");
                for byte in b {
                    hex.push_str(&format!("{byte:02x}"));
                }
                hex
            }
            Value::Blob(b) => String::from_utf8(b.clone())?,
        };
        out.extend_from_slice(text.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        Format::Text
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A value of type `ty` in PostgreSQL's binary form, as the front end returns it; an error
/// for bytes that are not one (never a panic: they come from another process).
pub fn decode(ty: &Type, raw: &[u8]) -> Result<Value, Box<dyn StdError + Sync + Send>> {
    Ok(match *ty {
        Type::BOOL => Value::Integer(i64::from(bool::from_sql(ty, raw)?)),
        Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
        Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
        Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
        Type::OID => Value::Integer(u32::from_sql(ty, raw)?.into()),
        Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
        Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
        Type::NUMERIC => Value::Text(numeric_text(raw)?),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN | Type::JSON => {
            Value::Text(String::from_sql(&Type::TEXT, raw)?)
        }
        Type::JSONB => match raw.split_first() {
            Some((1, json)) => Value::Text(std::str::from_utf8(json)?.to_owned()),
            _ => return Err("an unknown jsonb version".into()),
        },
        Type::BYTEA => Value::Blob(raw.to_vec()),
        Type::UUID => Value::Text(crate::engine::uuid_text(raw.try_into()?)),
        Type::DATE => match i32::from_sql(ty, raw)? {
            i32::MAX => Value::Text("infinity".into()),
            i32::MIN => Value::Text("-infinity".into()),
            days => Value::Text(crate::text::civil_date(i64::from(days) + POSTGRES_EPOCH_DAYS)),
        },
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            let micros = match i64::from_sql(ty, raw)? {
                i64::MAX => return Ok(Value::Text("infinity".into())),
                i64::MIN => return Ok(Value::Text("-infinity".into())),
                micros => micros,
            };
            let unix_micros = micros
                .checked_add(POSTGRES_EPOCH_DAYS * 86_400_000_000)
                .ok_or("a timestamp out of range")?;
            let secs = unix_micros.div_euclid(1_000_000);
            let (date, time) = crate::text::civil(secs);
            let fraction = unix_micros.rem_euclid(1_000_000);
            let zone = if *ty == Type::TIMESTAMPTZ { "+00" } else { "" };
            Value::Text(if fraction == 0 {
                format!("{date} {time}{zone}")
            } else {
                let digits = format!("{fraction:06}");
                format!("{date} {time}.{}{zone}", digits.trim_end_matches('0'))
            })
        }
        _ => return Err(format!("type {} is not decoded", ty.name()).into()),
    })
}

/// Days from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const POSTGRES_EPOCH_DAYS: i64 = 10_957;

/// A binary NUMERIC as its decimal text: base-10000 digits, a weight (the power of the first
/// digit), a sign and the digits shown after the point.
fn numeric_text(raw: &[u8]) -> Result<String, Box<dyn StdError + Sync + Send>> {
    let u16_at = |at: usize| -> Result<u16, Box<dyn StdError + Sync + Send>> {
        Ok(u16::from_be_bytes(
            raw.get(at..at + 2).ok_or("a truncated numeric")?.try_into()?,
        ))
    };
    let ndigits = usize::from(u16_at(0)?);
    let weight = i64::from(u16_at(2)? as i16);
    let sign = u16_at(4)?;
    let dscale = usize::from(u16_at(6)?);
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        0x0000 | 0x4000 => {}
        _ => return Err("an invalid numeric sign".into()),
    }
    let digits: Vec<u16> = (0..ndigits).map(|i| u16_at(8 + 2 * i)).collect::<Result<_, _>>()?;
    if digits.iter().any(|d| *d >= 10_000) {
        return Err("an invalid numeric digit".into());
    }
    let digit = |index: i64| -> u16 {
        usize::try_from(index)
            .ok()
            .and_then(|i| digits.get(i).copied())
            .unwrap_or(0)
    };
    let mut text = String::new();
    if sign == 0x4000 {
        text.push('-');
    }
    if weight < 0 {
        text.push('0');
    } else {
        text.push_str(&digit(0).to_string());
        for index in 1..=weight {
            text.push_str(&format!("{:04}", digit(index)));
        }
    }
    if dscale > 0 {
        let mut fraction = String::with_capacity(dscale + 4);
        let mut index = weight + 1;
        while fraction.len() < dscale {
            fraction.push_str(&format!("{:04}", digit(index)));
            index += 1;
        }
        fraction.truncate(dscale);
        text.push('.');
        text.push_str(&fraction);
    }
    Ok(text)
}

/// The writer's connection: Chorus's bookkeeping tables live beside the data, in the same
/// transactions. Commits do not wait for PostgreSQL's own WAL flush (`synchronous_commit =
/// off`): the log is what is durable, and PostgreSQL recovers a consistent, older state after a
/// crash, which the log brings forward.
///
/// Statements whose results nobody reads (BEGIN, `setseed`, the bookkeeping) are not sent on
/// their own: they go ahead of the next request, in its round trip (a transaction's BEGIN with
/// its first statement, its bookkeeping with its COMMIT).
pub struct Postgres {
    server: Arc<PgServer>,
    session: Session,
    /// Statements waiting to go ahead of the next request.
    deferred: Vec<Unread>,
    in_transaction: bool,
    /// The seed of the statement about to run, applied (`setseed`) only if it draws randoms.
    seed: Option<u64>,
    /// Passive replication's capture while this node leads: its slot's decoding stream.
    decoding: Option<pg_decoding::Stream>,
    /// Transactions from the log were applied since this node last recorded one: the
    /// sequences are behind their tables (write-sets carry values, not sequence advances).
    followed: bool,
    /// What the leader knows of the tables its write-sets touch, until the schema changes.
    tables: HashMap<Table, TableInfo>,
}

const BOOKKEEPING: &str = "
    CREATE TABLE IF NOT EXISTS _chorus_applied (
        only_row INTEGER PRIMARY KEY CHECK (only_row = 0),
        log_index BIGINT NOT NULL,
        command BIGINT NOT NULL,
        txn_incarnation BIGINT NOT NULL,
        txn_seq BIGINT NOT NULL);
    INSERT INTO _chorus_applied VALUES (0, 0, 0, 0, 0) ON CONFLICT DO NOTHING;
    CREATE TABLE IF NOT EXISTS _chorus_ahead (
        incarnation BIGINT NOT NULL,
        seq BIGINT NOT NULL,
        PRIMARY KEY (incarnation, seq));
    CREATE TABLE IF NOT EXISTS _chorus_sequences (
        name TEXT PRIMARY KEY,
        value BIGINT NOT NULL,
        called BOOLEAN NOT NULL);";

const BEGIN: &str = "BEGIN";

const SET_SEED: &str = "SELECT setseed($1)";

/// `setseed`'s argument for a seed: a value in [-1, 1].
fn seed_param(seed: u64) -> Value {
    let unit = (seed >> 11) as f64 / (1u64 << 53) as f64;
    Value::Real(unit * 2.0 - 1.0)
}

/// Whether a statement may call `random()` (seeded first so every replica draws alike).
fn draws_randoms(sql: &str) -> bool {
    mentions(sql, "random")
}

const MARK_APPLIED: &str =
    "UPDATE _chorus_applied SET log_index = $1, command = $2, txn_incarnation = $3, txn_seq = $4";

const MARK_AHEAD: &str = "INSERT INTO _chorus_ahead VALUES ($1, $2)";

/// Logical decoding reads only flushed WAL: a recorded transaction's commit waits for its flush.
const SYNCHRONOUS_COMMIT: &str = "SET LOCAL synchronous_commit = on";

/// The columns of a table: whether each is generated, in the key that finds a row (the primary
/// key, or the replica identity index where one is chosen), an identity column GENERATED ALWAYS.
const TABLE_INFO: &str = "
    SELECT a.attname::text, a.attgenerated <> '', COALESCE(a.attnum = ANY (i.indkey::int2[]), false),
           a.attidentity = 'a'
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_index i ON i.indrelid = c.oid
        AND CASE c.relreplident WHEN 'i' THEN i.indisreplident ELSE i.indisprimary END
    WHERE n.nspname = $1 AND c.relname = $2
    ORDER BY a.attnum";

/// Every sequence: its name, where it stands, and whether that value was drawn (else it is the
/// next one `nextval` gives).
macro_rules! sequence_positions {
    () => {
        "SELECT format('%I.%I', schemaname, sequencename), COALESCE(last_value, start_value), \
         last_value IS NOT NULL FROM pg_sequences"
    };
}

const SEQUENCES: &str = concat!(sequence_positions!(), " ORDER BY 1");

const SET_SEQUENCE: &str = "SELECT setval($1, $2, $3)";

/// Where the sequences stand, kept in a table so a checkpoint's snapshot holds it (a dump reads
/// sequences outside its snapshot).
const RECORD_SEQUENCES: &str = concat!(
    "BEGIN; DELETE FROM _chorus_sequences; INSERT INTO _chorus_sequences ",
    sequence_positions!(),
    "; COMMIT;"
);

/// Where the sequences stand, written in the transaction that records the applied log position:
/// sequences advance outside transactions (a replica's draws in a transaction cut short by a
/// crash stay drawn) and PostgreSQL's crash recovery moves them up to 32 values ahead, so a
/// node sets them back to this when it opens its database, and replays the log from there.
const RECORD_SEQUENCES_AT_MARK: &str = concat!(
    "INSERT INTO _chorus_sequences ",
    sequence_positions!(),
    " ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, called = EXCLUDED.called \
     WHERE (_chorus_sequences.value, _chorus_sequences.called) IS DISTINCT FROM (EXCLUDED.value, EXCLUDED.called)"
);

/// Sets every recorded sequence that still exists back to where it stood.
const RESTORE_SEQUENCES: &str = "SELECT setval(s.name, s.value, s.called) FROM _chorus_sequences s \
     JOIN pg_sequences q ON format('%I.%I', q.schemaname, q.sequencename) = s.name";

/// Brings each sequence a column owns (SERIAL, identity) up to the column's largest value.
const CATCH_UP_SEQUENCES: &str = "DO $$
DECLARE owned record;
BEGIN
  FOR owned IN
    SELECT d.objid::regclass AS seq, d.refobjid::regclass AS tbl, a.attname AS col
    FROM pg_depend d
    JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
    JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
    WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
      AND d.deptype IN ('a', 'i') AND a.atttypid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype)
  LOOP
    EXECUTE format('SELECT setval(%L, m) FROM (SELECT max(%I) AS m FROM %s) t '
                   'WHERE m >= (SELECT last_value FROM %s)', owned.seq, owned.col, owned.tbl, owned.seq);
  END LOOP;
END $$";

/// Whether a statement may change a table's columns or keys: anything but plain DML, queries
/// and transaction control (a comment first counts as a change: forgetting costs one query).
fn may_change_schema(sql: &str) -> bool {
    let first = sql
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("");
    ![
        "SELECT",
        "INSERT",
        "UPDATE",
        "DELETE",
        "WITH",
        "VALUES",
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "SAVEPOINT",
        "RELEASE",
        "SET",
        "SHOW",
        "START",
        "END",
    ]
    .iter()
    .any(|word| word.eq_ignore_ascii_case(first))
}

/// How long a starting node waits for its PostgreSQL server to take connections: a server
/// restarted after a crash (or a reboot) replays its WAL first and refuses connections
/// meanwhile (SQLSTATE 57P03), and a server started beside the node may not listen yet.
const SERVER_READY_WAIT: Duration = Duration::from_secs(120);

/// Returns once `server` takes connections, or with its refusal after `SERVER_READY_WAIT`, or
/// at once with an error that waiting does not mend (a password asked for, say).
pub async fn wait_until_ready(server: &PgServer) -> Result<(), SqlError> {
    let deadline = Instant::now() + SERVER_READY_WAIT;
    let mut told = false;
    loop {
        match pg_blocking::Connection::connect(&server.config, "") {
            Ok(_) => return Ok(()),
            Err(e) if (e.code == "57P03" || e.is_connection_failure()) && Instant::now() < deadline => {
                if !told {
                    tracing::warn!(reason = %e, wait_s = SERVER_READY_WAIT.as_secs(),
                        "the node's PostgreSQL server does not take connections yet; waiting for it");
                    told = true;
                }
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fails, saying what to set, unless `server` can decode its WAL for a slot (passive mode).
pub fn require_logical_decoding(server: &PgServer) -> Result<(), SqlError> {
    let mut reader = PgReader::open(server)?;
    let settings = reader.run(
        "SELECT current_setting('wal_level'), current_setting('max_wal_senders')::int, \
         current_setting('max_replication_slots')::int",
        &[],
    )?;
    match settings.rows.first().map(Vec::as_slice) {
        Some([Value::Text(level), Value::Integer(senders), Value::Integer(slots)])
            if level == "logical" && *senders > 0 && *slots > 0 =>
        {
            Ok(())
        }
        found => Err(decoding_error(SqlError::new(
            "55000",
            format!("the node's PostgreSQL has (wal_level, max_wal_senders, max_replication_slots) = {found:?}"),
        ))),
    }
}

/// An error of logical decoding, with what a node's server needs for it.
fn decoding_error(e: SqlError) -> SqlError {
    SqlError::new(
        e.code,
        format!(
            "{}: passive replication on the PostgreSQL engine reads the node's server's logical \
             decoding, which needs wal_level = logical and max_wal_senders of 1 or more (`chorus \
             cluster start` sets both)",
            e.message
        ),
    )
}

/// The table a decoded row change is about.
fn table_of(line: &Line) -> Option<&Table> {
    match line {
        Line::Insert { table, .. } | Line::Update { table, .. } | Line::Delete { table, .. } => Some(table),
        _ => None,
    }
}

/// Whether a decoded change is of Chorus's own bookkeeping.
fn is_bookkeeping(table: &Table) -> bool {
    table.schema == "public" && table.name.starts_with(crate::text::RESERVED_PREFIX)
}

impl Postgres {
    pub fn open(server: Arc<PgServer>) -> Result<Postgres, SqlError> {
        let mut session = Session::open(&server, "-c synchronous_commit=off")?;
        session.conn.batch(BOOKKEEPING)?;
        session.conn.batch(RESTORE_SEQUENCES)?;
        let mut postgres = Postgres {
            server,
            session,
            deferred: Vec::new(),
            in_transaction: false,
            seed: None,
            decoding: None,
            followed: true,
            tables: HashMap::new(),
        };
        // A slot left by an earlier run holds WAL back until it is read: it goes.
        postgres.drop_slot()?;
        Ok(postgres)
    }

    /// Drops the node's decoding slot if it exists (its stream closed: the server may take a
    /// moment to let the slot go).
    fn drop_slot(&mut self) -> Result<(), SqlError> {
        let drop = format!(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{}'",
            pg_decoding::SLOT
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.session.conn.batch(&drop) {
                Err(e) if e.code == "55006" && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                dropped => return dropped,
            }
        }
    }

    /// This node applies another leader's transactions now: it stops capturing write-sets.
    fn follow(&mut self) -> Result<(), SqlError> {
        self.followed = true;
        if self.decoding.take().is_some() {
            self.drop_slot()?;
        }
        Ok(())
    }

    /// Forgets what it knows of the tables if `sql` may change them.
    fn watch_schema(&mut self, sql: &str) {
        if may_change_schema(sql) {
            self.tables.clear();
        }
    }

    /// The write-set of transaction `id`, just committed, from the decoding stream (earlier
    /// transactions on it — bookkeeping, schema changes — are passed over).
    fn captured(&mut self, id: TxnId) -> Result<Vec<u8>, String> {
        let marker_prefix = format!("table public.{}ahead: INSERT:", crate::text::RESERVED_PREFIX);
        let marker = [id.incarnation as i64, id.seq as i64].map(|n| Datum::Text(n.to_string()));
        loop {
            let stream = self.decoding.as_mut().ok_or("no decoding stream")?;
            let lines = stream.next_transaction().map_err(|e| {
                // The stream's place is unknown: the next transaction starts a new slot.
                self.decoding = None;
                e.to_string()
            })?;
            let ours = lines
                .iter()
                .filter(|line| line.starts_with(&marker_prefix))
                .any(|line| {
                    matches!(pg_write_set::parse_line(line), Ok(Line::Insert { new, .. })
                    if new.iter().map(|field| &field.datum).eq(marker.iter()))
                });
            if !ours {
                continue;
            }
            let mut changes = Vec::with_capacity(lines.len());
            for line in &lines {
                let parsed = pg_write_set::parse_line(line)?;
                let info = match (&parsed, table_of(&parsed)) {
                    (Line::Message, _) => continue,
                    (_, Some(table)) if is_bookkeeping(table) => continue,
                    (_, Some(table)) => self.table_info(table)?,
                    (_, None) => &TableInfo::default(),
                };
                changes.push(pg_write_set::resolve(parsed, info)?);
            }
            return Ok(pg_write_set::encode(&pg_write_set::group(changes)));
        }
    }

    fn table_info(&mut self, table: &Table) -> Result<&TableInfo, String> {
        if !self.tables.contains_key(table) {
            let outcome = self
                .run(
                    TABLE_INFO,
                    &[Value::Text(table.schema.clone()), Value::Text(table.name.clone())],
                )
                .map_err(|e| e.to_string())?;
            let mut info = TableInfo::default();
            for row in outcome.rows {
                let [Value::Text(name), generated, key, identity_always] = row.as_slice() else {
                    return Err(format!("{TABLE_INFO} gave {row:?}"));
                };
                if *identity_always == Value::Integer(1) {
                    info.identity_always.push(name.clone());
                }
                if *generated == Value::Integer(1) {
                    info.generated.push(name.clone());
                }
                if *key == Value::Integer(1) {
                    info.key.push(name.clone());
                }
            }
            self.tables.insert(table.clone(), info);
        }
        Ok(&self.tables[table])
    }

    fn defer(&mut self, sql: &str, params: Vec<Value>) {
        self.deferred.push((sql.to_owned(), params));
    }

    /// Sends the deferred statements and then `tail`, in one round trip, reading only the rows
    /// each changed.
    fn pipeline(&mut self, tail: Vec<Unread>) -> Result<Vec<u64>, SqlError> {
        let mut all = std::mem::take(&mut self.deferred);
        all.extend(tail);
        self.session.pipeline(&all)
    }

    /// Runs one statement, after the deferred ones, and collects what it gave.
    fn run(&mut self, sql: &str, params: &[Value]) -> Result<Outcome, SqlError> {
        let deferred = std::mem::take(&mut self.deferred);
        self.session.run(&deferred, sql, params)
    }

    fn txn_params(id: TxnId) -> Vec<Value> {
        vec![Value::Integer(id.incarnation as i64), Value::Integer(id.seq as i64)]
    }
}

impl Engine for Postgres {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn begin(&mut self) -> Result<(), SqlError> {
        assert!(
            self.deferred.is_empty(),
            "statements deferred outside a transaction: {:?}",
            self.deferred
        );
        self.defer(BEGIN, Vec::new());
        self.in_transaction = true;
        Ok(())
    }

    fn commit(&mut self) -> Result<(), SqlError> {
        self.in_transaction = false;
        if self.deferred.len() == 1 && self.deferred[0].0 == BEGIN {
            // Nothing ran: nothing to commit.
            self.deferred.clear();
            return Ok(());
        }
        let committed = self.pipeline(vec![("COMMIT".to_owned(), Vec::new())]).map(drop);
        if committed.is_err() {
            // A failed statement ahead of COMMIT left the transaction open (and aborted): it
            // ends here, so the connection is clean for the next.
            if let Err(e) = self.session.conn.batch("ROLLBACK") {
                panic!("PostgreSQL cannot roll back the writer's failed transaction: {e}");
            }
        }
        committed
    }

    fn rollback(&mut self) {
        if std::mem::take(&mut self.in_transaction) {
            let begun = self.deferred.first().is_none_or(|(sql, _)| sql != BEGIN);
            self.deferred.clear();
            if begun {
                if let Err(e) = self.session.conn.batch("ROLLBACK") {
                    panic!("PostgreSQL cannot roll back the writer's transaction: {e}");
                }
            }
        }
    }

    fn seed(&mut self, seed: u64) {
        self.seed = Some(seed);
    }

    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<Outcome, SqlError> {
        self.watch_schema(sql);
        if let Some(seed) = self.seed.take() {
            if draws_randoms(sql) {
                self.defer(SET_SEED, vec![seed_param(seed)]);
            }
        }
        self.run(sql, params)
    }

    /// Pipelined: every statement is sent before the first reply is read, so a replica's
    /// replay costs one round trip to its server rather than one per statement.
    fn execute_unread(&mut self, statements: &[(u64, &Logged)]) -> Result<(), SqlError> {
        self.follow()?;
        self.seed = None;
        let mut tail = Vec::with_capacity(statements.len());
        for (seed, statement) in statements {
            self.watch_schema(&statement.sql);
            if draws_randoms(&statement.sql) {
                tail.push((SET_SEED.to_owned(), vec![seed_param(*seed)]));
            }
            tail.push((statement.sql.clone(), statement.params.clone()));
        }
        self.pipeline(tail).map(drop)
    }

    fn mark_applied(&mut self, mark: AppliedMark) -> Result<(), SqlError> {
        self.defer(
            MARK_APPLIED,
            vec![
                Value::Integer(mark.log_index as i64),
                Value::Integer(mark.command.into()),
                Value::Integer(mark.last_txn.incarnation as i64),
                Value::Integer(mark.last_txn.seq as i64),
            ],
        );
        self.defer(RECORD_SEQUENCES_AT_MARK, Vec::new());
        Ok(())
    }

    fn mark_ahead(&mut self, id: TxnId) -> Result<(), SqlError> {
        self.defer(MARK_AHEAD, Self::txn_params(id));
        Ok(())
    }

    fn clear_ahead(&mut self, id: TxnId) -> Result<(), SqlError> {
        self.defer(
            "DELETE FROM _chorus_ahead WHERE incarnation = $1 AND seq = $2",
            Self::txn_params(id),
        );
        Ok(())
    }

    fn applied(&mut self) -> Result<AppliedMark, SqlError> {
        let outcome = self.run(
            "SELECT log_index, command, txn_incarnation, txn_seq FROM _chorus_applied",
            &[],
        )?;
        let integer = |i: usize| match outcome.rows.first().and_then(|row| row.get(i)) {
            Some(Value::Integer(n)) => Ok(*n as u64),
            other => Err(SqlError::new(
                "XX001",
                format!("_chorus_applied holds {other:?} where a position belongs"),
            )),
        };
        Ok(AppliedMark {
            log_index: integer(0)?,
            command: integer(1)? as u32,
            last_txn: TxnId {
                incarnation: integer(2)?,
                seq: integer(3)?,
            },
        })
    }

    fn holds_ahead(&mut self) -> Result<bool, SqlError> {
        let outcome = self.run("SELECT EXISTS (SELECT 1 FROM _chorus_ahead)", &[])?;
        Ok(outcome.rows.first().and_then(|row| row.first()) == Some(&Value::Integer(1)))
    }

    fn restore(&mut self, checkpoint: Option<&Path>, mark: AppliedMark) -> Result<(), SqlError> {
        self.rollback();
        self.follow()?;
        self.tables.clear();
        // Empties the database: every table, view, sequence and function of the public schema.
        self.session.forget_prepared()?;
        self.session
            .conn
            .batch("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")?;
        if let Some(checkpoint) = checkpoint {
            let mut restore = self.server.program("pg_restore");
            restore
                .args(["--no-owner", "--single-transaction", "--exit-on-error", "-d"])
                .arg(&self.server.conninfo)
                .arg(checkpoint);
            run_program(restore, "pg_restore")?;
            // The dump read the sequences when it got to them, later than its snapshot: they
            // go back to where they stood at the checkpoint (a checkpoint older than this
            // record has none to restore).
            self.session.conn.batch(BOOKKEEPING)?;
            self.session.conn.batch(RESTORE_SEQUENCES)?;
        } else {
            self.session.conn.batch(BOOKKEEPING)?;
        }
        self.begin()?;
        self.defer("DELETE FROM _chorus_ahead", Vec::new());
        self.mark_applied(mark)?;
        self.commit()
    }

    fn record_writes(&mut self) -> Result<(), SqlError> {
        // Outside the transaction: its BEGIN is still deferred.
        if self.decoding.is_none() {
            self.drop_slot()?;
            let create = format!(
                "SELECT pg_create_logical_replication_slot('{}', 'test_decoding')",
                pg_decoding::SLOT
            );
            self.session.conn.batch(&create).map_err(decoding_error)?;
            self.decoding = Some(pg_decoding::Stream::start(&self.server.config).map_err(decoding_error)?);
        }
        if self.followed {
            self.session.conn.batch(CATCH_UP_SEQUENCES)?;
            self.followed = false;
        }
        Ok(())
    }

    fn commit_recorded(&mut self, id: TxnId) -> Result<Recorded, SqlError> {
        self.mark_ahead(id)?;
        self.defer(SYNCHRONOUS_COMMIT, Vec::new());
        self.commit()?;
        Ok(match self.captured(id) {
            Ok(write_set) => Recorded::WriteSet(write_set),
            Err(why) => Recorded::Unrecordable(why),
        })
    }

    /// Pipelined, one round trip per write-set; each statement must change the rows the
    /// leader's did.
    fn apply_write_set(&mut self, write_set: &[u8]) -> Result<(), SqlError> {
        self.follow()?;
        let groups = pg_write_set::decode(write_set)
            .map_err(|e| SqlError::new("XX001", format!("a write-set that does not decode: {e}")))?;
        if !self.in_transaction {
            self.begin()?;
        }
        let mut all = std::mem::take(&mut self.deferred);
        let first = all.len();
        let mut expected = Vec::new();
        for apply in groups.into_iter().flat_map(pg_write_set::statements) {
            all.push((apply.sql, apply.params));
            expected.push(apply.rows);
        }
        let changed = self.session.pipeline(&all)?;
        if changed.len() != all.len() {
            return Err(SqlError::new(
                "08P01",
                format!("{} statements sent, {} answered", all.len(), changed.len()),
            ));
        }
        let mismatch = expected
            .iter()
            .zip(&changed[first..])
            .position(|(expected, changed)| expected.is_some_and(|expected| expected != *changed));
        match mismatch {
            None => Ok(()),
            Some(at) => Err(pg_write_set::diverged(
                &all[first + at].0,
                expected[at].unwrap_or(0),
                changed[first + at],
            )),
        }
    }

    fn sequences_outside_transactions(&self) -> bool {
        true
    }

    fn record_sequences(&mut self) -> Result<(), SqlError> {
        assert!(!self.in_transaction, "sequences are recorded between transactions");
        self.session.conn.batch(RECORD_SEQUENCES)
    }

    fn sequence_settings(&mut self) -> Result<Vec<Logged>, SqlError> {
        let outcome = self.run(SEQUENCES, &[])?;
        outcome
            .rows
            .into_iter()
            .map(|row| match row.as_slice() {
                [name @ Value::Text(_), value @ Value::Integer(_), called @ Value::Integer(_)] => Ok(Logged {
                    sql: SET_SEQUENCE.to_owned(),
                    params: vec![name.clone(), value.clone(), called.clone()],
                }),
                other => Err(SqlError::new("XX000", format!("{SEQUENCES} gave {other:?}"))),
            })
            .collect()
    }

    fn end_write_sets(&mut self, mark: Option<AppliedMark>) -> Result<(), SqlError> {
        if !self.in_transaction {
            return Ok(());
        }
        match mark {
            Some(mark) => {
                self.mark_applied(mark)?;
                self.commit()
            }
            None => {
                self.rollback();
                Ok(())
            }
        }
    }
}

fn run_program(mut command: Command, what: &str) -> Result<(), SqlError> {
    let output = command
        .output()
        .map_err(|e| SqlError::new("58000", format!("cannot run {what}: {e}")))?;
    if !output.status.success() {
        return Err(SqlError::new(
            "58000",
            format!(
                "{what} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        ));
    }
    Ok(())
}

/// A read-only connection; a read transaction is REPEATABLE READ, so its statements see one
/// state, as a SQLite read transaction does.
pub struct PgReader {
    session: Session,
    in_transaction: bool,
}

impl PgReader {
    pub fn open(server: &PgServer) -> Result<PgReader, SqlError> {
        Ok(PgReader {
            session: Session::open(server, "-c default_transaction_read_only=on")?,
            in_transaction: false,
        })
    }

    pub fn run(&mut self, sql: &str, params: &[Value]) -> Result<Outcome, SqlError> {
        self.session.run(&[], sql, params)
    }

    pub fn begin(&mut self) -> Result<(), SqlError> {
        self.session
            .conn
            .batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
        self.in_transaction = true;
        Ok(())
    }

    pub fn end(&mut self) {
        if std::mem::take(&mut self.in_transaction) {
            let _ = self.session.conn.batch("ROLLBACK");
        }
    }

    /// Whether it can serve another session: no transaction open, the connection sound.
    pub fn is_idle(&self) -> bool {
        !self.in_transaction && !self.session.conn.is_broken()
    }

    pub fn describe(&mut self, sql: &str) -> Option<Vec<Column>> {
        self.session.describe(sql).ok()
    }
}

/// Pins the database in a snapshot exported from a read transaction; the copy is `pg_dump` of
/// that snapshot, while the transaction holds it.
pub fn pin_for_checkpoint(server: &Arc<PgServer>) -> Result<CheckpointCopy, SqlError> {
    let mut reader = PgReader::open(server)?;
    reader.begin()?;
    let exported = reader.run("SELECT pg_export_snapshot()", &[])?;
    let Some(Some(Value::Text(snapshot))) = exported.rows.first().map(|row| row.first()) else {
        return Err(SqlError::new(
            "XX000",
            format!("pg_export_snapshot gave {:?}", exported.rows),
        ));
    };
    let snapshot = snapshot.clone();
    let server = server.clone();
    Ok(Box::new(move |target: &Path| {
        let mut dump = server.program("pg_dump");
        dump.args(["--format=custom", "--compress=1", "--no-owner", "--snapshot"])
            .arg(&snapshot)
            .arg("--file")
            .arg(target)
            .arg(&server.conninfo);
        let dumped = run_program(dump, "pg_dump").map_err(std::io::Error::other);
        drop(reader);
        dumped
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numeric(ndigits: u16, weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> String {
        let mut raw = Vec::new();
        for part in [ndigits, weight as u16, sign, dscale].iter().chain(digits) {
            raw.extend_from_slice(&part.to_be_bytes());
        }
        numeric_text(&raw).unwrap()
    }

    #[test]
    fn numerics_read_as_postgresql_prints_them() {
        assert_eq!(numeric(2, 0, 0, 2, &[12, 3400]), "12.34");
        assert_eq!(numeric(1, 1, 0x4000, 0, &[5]), "-50000");
        assert_eq!(numeric(1, -1, 0, 4, &[5]), "0.0005");
        assert_eq!(numeric(1, -2, 0, 6, &[7]), "0.000000");
        assert_eq!(numeric(0, 0, 0, 2, &[]), "0.00");
        assert_eq!(numeric(3, 1, 0, 3, &[1, 0, 1200]), "10000.120");
        assert!(numeric_text(&[0, 1]).is_err());
    }
}
