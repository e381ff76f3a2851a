//! A transaction's write-set taken from SQLite's pre-update hook, written in the session
//! extension's changeset format (what `write_set::apply` reads and every node applies).
//!
//! The session extension, asked for a changeset, prepares a SELECT per table it recorded and
//! re-reads each table's columns with a PRAGMA first: 5.5% of a hybrid TPC-C node's CPU went to
//! compiling those statements (7.8% to the whole changeset). This records what the session
//! extension records — per row its key and, at its first change, its values before — and reads
//! the rows as they are now with statements kept prepared on the connection.
//!
//! Rows are read back rather than followed through the hook because a statement that fails
//! (or a ROLLBACK TO) undoes changes the hook saw; the rows as they are at the end are the
//! truth. As with `sqlite3session_attach(NULL)` and tables without a primary key keyed by
//! rowid: every table of `main` is recorded, a row whose key holds a NULL is not, an UPDATE
//! changing a key records the old key (as it was) and the new one (as absent before), and the
//! changeset holds the net change — an INSERT of a row that was not there, a DELETE of one now
//! gone, an UPDATE naming the key and the old and new values of the columns that differ.
//! While the capture is paused (write-sets applied under the transaction that are not its
//! own) nothing is recorded, as with `sqlite3session_enable(0)`.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{ffi, Connection, ToSql};

use crate::error::SqlError;
use crate::table_columns::{self, ColumnInfo};
use crate::write_set::{quoted, value_of};

/// The changeset's operation codes (SQLite's).
const INSERT: u8 = ffi::SQLITE_INSERT as u8;
const DELETE: u8 = ffi::SQLITE_DELETE as u8;
const UPDATE: u8 = ffi::SQLITE_UPDATE as u8;

/// A field the changeset leaves undefined (an update's unchanged column).
const UNDEFINED: u8 = 0;

/// Where a changeset column's value comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Column {
    /// The rowid of a table without a primary key.
    Rowid,
    /// The hook's value at this index (the column's `cid`, hidden columns counted).
    At(c_int),
}

/// A table's shape as the changeset records it.
#[derive(Debug)]
struct TableInfo {
    columns: Vec<Column>,
    primary_key: Vec<bool>,
    /// Columns the hook reports, hidden ones included.
    hook_columns: c_int,
    /// Reads a row as it is now, by its key: the changeset's columns, in order.
    select: String,
}

/// Tables' shapes, kept between transactions for as long as the schema version holds.
#[derive(Default)]
pub struct Tables {
    schema_version: Option<u64>,
    by_name: HashMap<Vec<u8>, Arc<TableInfo>>,
}

/// A row changed by the transaction.
struct Row {
    /// Its key's encoded fields, in key-column order.
    key: Vec<u8>,
    /// Its encoded fields before its first change; None if it did not exist.
    before: Option<Vec<u8>>,
    /// Every change to it came from a trigger or a foreign-key action.
    indirect: bool,
}

struct TableChanges {
    /// As SQLite named it in the hook.
    name: Vec<u8>,
    info: Arc<TableInfo>,
    rows: Vec<Row>,
    /// Encoded key → index in `rows`.
    by_key: HashMap<Vec<u8>, usize>,
}

struct State {
    db: *mut ffi::sqlite3,
    recording: bool,
    tables: Arc<Mutex<Tables>>,
    changes: Vec<TableChanges>,
    /// The first failure; the capture then records nothing more and taking it fails.
    failure: Option<String>,
}

/// A pre-update hook recording one transaction's changes on a connection, until dropped.
pub struct Capture {
    state: Box<State>,
}

// SAFETY: the state is reached only through the connection it hooks, on whichever thread
// owns that connection, and the connection moves with the engine that owns both.
unsafe impl Send for Capture {}

impl Capture {
    /// Starts recording on `db`, with shapes from `tables` (forgotten first if
    /// `schema_version` moved).
    ///
    /// # Safety
    /// `db` is an open connection without another pre-update hook or session, used only on the
    /// thread that owns the capture, and it outlives the capture.
    pub unsafe fn start(db: *mut ffi::sqlite3, tables: Arc<Mutex<Tables>>, schema_version: u64) -> Capture {
        {
            let mut known = tables.lock().expect("table shapes are not poisoned");
            if known.schema_version != Some(schema_version) {
                known.by_name.clear();
                known.schema_version = Some(schema_version);
            }
        }
        let mut state = Box::new(State {
            db,
            recording: true,
            tables,
            changes: Vec::new(),
            failure: None,
        });
        let context: *mut State = &mut *state;
        // SAFETY: the state is boxed (its address is stable) and the hook is removed in drop,
        // before the box is freed.
        unsafe { ffi::sqlite3_preupdate_hook(db, Some(on_change), context.cast()) };
        Capture { state }
    }

    /// Pauses or resumes recording.
    pub fn set_recording(&mut self, recording: bool) {
        self.state.recording = recording;
    }

    /// The changeset of the net changes recorded (empty if none), the rows as they are now
    /// read on `conn` (the hooked connection).
    pub fn changeset(&self, conn: &Connection) -> Result<Vec<u8>, SqlError> {
        if let Some(failure) = &self.state.failure {
            return Err(SqlError::new(
                "XX000",
                format!("cannot record the transaction's writes: {failure}"),
            ));
        }
        let mut out = Vec::new();
        for table in &self.state.changes {
            let header_at = out.len();
            append_header(&mut out, table);
            let empty = out.len();
            let mut select = conn
                .prepare_cached(&table.info.select)
                .map_err(|e| SqlError::from_sqlite(&e))?;
            for row in &table.rows {
                let mut rows = select
                    .query(rusqlite::params_from_iter(fields(&row.key).into_iter().map(Field)))
                    .map_err(|e| SqlError::from_sqlite(&e))?;
                let now = match rows.next().map_err(|e| SqlError::from_sqlite(&e))? {
                    Some(found) => {
                        let mut fields = Vec::new();
                        for i in 0..table.info.columns.len() {
                            put_value(&mut fields, found.get_ref(i).map_err(|e| SqlError::from_sqlite(&e))?);
                        }
                        Some(fields)
                    }
                    None => None,
                };
                append_row(&mut out, &table.info, row, now);
            }
            if out.len() == empty {
                out.truncate(header_at);
            }
        }
        Ok(out)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        // SAFETY: the connection is open (it outlives the capture); this removes the hook set
        // in `start` before the state it points to is freed.
        unsafe { ffi::sqlite3_preupdate_hook(self.state.db, None, std::ptr::null_mut()) };
    }
}

/// The table's header: 'T', the column count, the primary-key flags, the name.
fn append_header(out: &mut Vec<u8>, table: &TableChanges) {
    out.push(b'T');
    put_varint(out, table.info.columns.len() as u64);
    out.extend(table.info.primary_key.iter().map(|&pk| u8::from(pk)));
    out.extend_from_slice(&table.name);
    out.push(0);
}

fn append_row(out: &mut Vec<u8>, info: &TableInfo, row: &Row, now: Option<Vec<u8>>) {
    match (&row.before, now) {
        (None, None) => {}
        (None, Some(now)) => {
            out.extend([INSERT, u8::from(row.indirect)]);
            out.extend_from_slice(&now);
        }
        (Some(before), None) => {
            out.extend([DELETE, u8::from(row.indirect)]);
            out.extend_from_slice(before);
        }
        (Some(before), Some(now)) => {
            let old_fields = fields(before);
            let new_fields = fields(&now);
            if old_fields == new_fields {
                return;
            }
            out.extend([UPDATE, u8::from(row.indirect)]);
            for ((old, new), &pk) in old_fields.iter().zip(&new_fields).zip(&info.primary_key) {
                if pk || old != new {
                    out.extend_from_slice(old);
                } else {
                    out.push(UNDEFINED);
                }
            }
            for (old, new) in old_fields.iter().zip(&new_fields) {
                if old != new {
                    out.extend_from_slice(new);
                } else {
                    out.push(UNDEFINED);
                }
            }
        }
    }
}

/// The encoded fields of a record this module wrote.
fn fields(record: &[u8]) -> Vec<&[u8]> {
    let mut fields = Vec::new();
    let mut at = 0;
    while at < record.len() {
        let start = at;
        at += 1;
        match record[start] {
            1 | 2 => at += 8,
            3 | 4 => {
                let (len, size) = get_varint(&record[at..]);
                at += size + len as usize;
            }
            _ => {}
        }
        fields.push(&record[start..at]);
    }
    fields
}

/// An encoded field, bound as the value it encodes (text as its bytes, unchecked).
struct Field<'a>(&'a [u8]);

impl ToSql for Field<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        let bytes = self.0;
        let eight = || <[u8; 8]>::try_from(&bytes[1..9]).expect("a number's field holds 8 bytes");
        Ok(ToSqlOutput::Borrowed(match bytes[0] {
            1 => ValueRef::Integer(i64::from_be_bytes(eight())),
            2 => ValueRef::Real(f64::from_bits(u64::from_be_bytes(eight()))),
            kind @ (3 | 4) => {
                let (len, size) = get_varint(&bytes[1..]);
                let data = &bytes[1 + size..1 + size + len as usize];
                if kind == 3 {
                    ValueRef::Text(data)
                } else {
                    ValueRef::Blob(data)
                }
            }
            _ => ValueRef::Null,
        }))
    }
}

/// SQLite's varint: big-endian groups of 7 bits, a set top bit on all but the last (values
/// under 2^56, which every length is).
fn put_varint(out: &mut Vec<u8>, value: u64) {
    assert!(value < 1 << 56, "a varint of this module is a length");
    let mut groups = [0u8; 8];
    let mut count = 0;
    let mut rest = value;
    loop {
        groups[count] = (rest & 0x7f) as u8;
        count += 1;
        rest >>= 7;
        if rest == 0 {
            break;
        }
    }
    for (i, group) in groups[..count].iter().enumerate().rev() {
        out.push(if i == 0 { *group } else { group | 0x80 });
    }
}

/// A varint this module wrote: its value and size.
fn get_varint(bytes: &[u8]) -> (u64, usize) {
    let mut value = 0;
    for (i, byte) in bytes.iter().enumerate() {
        value = (value << 7) | u64::from(byte & 0x7f);
        if byte & 0x80 == 0 {
            return (value, i + 1);
        }
    }
    unreachable!("a record this module wrote ends its varints")
}

/// Appends a value in the changeset's encoding.
fn put_value(out: &mut Vec<u8>, value: ValueRef) {
    match value {
        ValueRef::Integer(i) => {
            out.push(1);
            out.extend(i.to_be_bytes());
        }
        ValueRef::Real(r) => {
            out.push(2);
            out.extend(r.to_bits().to_be_bytes());
        }
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
            out.push(if matches!(value, ValueRef::Text(_)) { 3 } else { 4 });
            put_varint(out, bytes.len() as u64);
            out.extend_from_slice(bytes);
        }
        ValueRef::Null => out.push(5),
    }
}

/// The pre-update hook: records the change into the capture `context` points to.
unsafe extern "C" fn on_change(
    context: *mut c_void,
    db: *mut ffi::sqlite3,
    op: c_int,
    database: *const c_char,
    table: *const c_char,
    old_rowid: ffi::sqlite3_int64,
    new_rowid: ffi::sqlite3_int64,
) {
    // SAFETY: `context` is the boxed state `Capture::start` registered, alive while the hook
    // is set; SQLite calls the hook on the thread running the statement, which owns it.
    let state = unsafe { &mut *context.cast::<State>() };
    if !state.recording || state.failure.is_some() {
        return;
    }
    // SAFETY: SQLite passes nul-terminated names valid for the call.
    let (database, table) = unsafe { (CStr::from_ptr(database), CStr::from_ptr(table)) };
    if !database.to_bytes().eq_ignore_ascii_case(b"main") {
        return;
    }
    // SAFETY: inside the hook, on its connection.
    let recorded = unsafe {
        match op {
            ffi::SQLITE_INSERT => record(state, db, table.to_bytes(), new_rowid, false),
            ffi::SQLITE_DELETE => record(state, db, table.to_bytes(), old_rowid, true),
            _ => record(state, db, table.to_bytes(), old_rowid, true)
                .and_then(|()| record(state, db, table.to_bytes(), new_rowid, false)),
        }
    };
    if let Err(failure) = recorded {
        state.failure = Some(failure);
    }
}

/// Records the row of this change under its old key (`existed`: the hook's old values) or its
/// new one (the new values; the row was not there before), unless that key is recorded.
///
/// # Safety
/// Called from the hook with its connection.
unsafe fn record(
    state: &mut State,
    db: *mut ffi::sqlite3,
    table: &[u8],
    rowid: i64,
    existed: bool,
) -> Result<(), String> {
    let at = match state.changes.iter().position(|t| t.name.eq_ignore_ascii_case(table)) {
        Some(at) => at,
        None => {
            // SAFETY: the caller's.
            let info = unsafe { table_info(&state.tables, db, table, false)? };
            state.changes.push(TableChanges {
                name: table.to_vec(),
                info,
                rows: Vec::new(),
                by_key: HashMap::new(),
            });
            state.changes.len() - 1
        }
    };
    // SAFETY: inside the hook.
    let hook_columns = unsafe { ffi::sqlite3_preupdate_count(db) };
    let changes = &mut state.changes[at];
    if changes.info.hook_columns != hook_columns {
        // The table changed shape within the transaction (ALTER TABLE … ADD COLUMN).
        // SAFETY: the caller's.
        changes.info = unsafe { table_info(&state.tables, db, table, true)? };
        if changes.info.hook_columns != hook_columns || !changes.rows.is_empty() {
            return Err(format!(
                "table {} changed its columns within the transaction",
                String::from_utf8_lossy(table)
            ));
        }
    }
    let hook_value: HookValue = if existed {
        ffi::sqlite3_preupdate_old
    } else {
        ffi::sqlite3_preupdate_new
    };
    let info = changes.info.clone();
    // SAFETY: inside the hook; `hook_value` gives this change's old or new values.
    let value = |column: Column| -> Result<ValueRef<'_>, String> {
        match column {
            Column::Rowid => Ok(ValueRef::Integer(rowid)),
            Column::At(index) => {
                let mut value = std::ptr::null_mut();
                let code = unsafe { hook_value(db, index, &mut value) };
                if code != ffi::SQLITE_OK || value.is_null() {
                    return Err(format!("SQLite gave no value for column {index} (code {code})"));
                }
                // SAFETY: the value lives until the hook returns, past this use.
                Ok(unsafe { value_of(value) }.unwrap_or(ValueRef::Null))
            }
        }
    };
    let mut encoded_key = Vec::new();
    for (&column, _) in info.columns.iter().zip(&info.primary_key).filter(|(_, &pk)| pk) {
        let field = value(column)?;
        if field == ValueRef::Null {
            // Not recorded, as by the session extension.
            return Ok(());
        }
        put_value(&mut encoded_key, field);
    }
    // SAFETY: inside the hook.
    let indirect = unsafe { ffi::sqlite3_preupdate_depth(db) } > 0;
    if let Some(&known) = changes.by_key.get(&encoded_key) {
        changes.rows[known].indirect &= indirect;
        return Ok(());
    }
    let before = if existed {
        let mut before = Vec::new();
        for &column in &info.columns {
            put_value(&mut before, value(column)?);
        }
        Some(before)
    } else {
        None
    };
    changes.by_key.insert(encoded_key.clone(), changes.rows.len());
    changes.rows.push(Row {
        key: encoded_key,
        before,
        indirect,
    });
    Ok(())
}

type HookValue = unsafe extern "C" fn(*mut ffi::sqlite3, c_int, *mut *mut ffi::sqlite3_value) -> c_int;

/// The shape of table `name`, from `tables` unless `reload`, else read (on the hook's
/// connection) and remembered.
///
/// # Safety
/// Inside the hook, on its connection.
unsafe fn table_info(
    tables: &Mutex<Tables>,
    db: *mut ffi::sqlite3,
    name: &[u8],
    reload: bool,
) -> Result<Arc<TableInfo>, String> {
    let lower = name.to_ascii_lowercase();
    let mut tables = tables.lock().expect("table shapes are not poisoned");
    if !reload {
        if let Some(info) = tables.by_name.get(&lower) {
            return Ok(info.clone());
        }
    }
    // SAFETY: the caller's.
    let info = Arc::new(unsafe { read_table_info(db, name)? });
    tables.by_name.insert(lower, info.clone());
    Ok(info)
}

/// Reads a table's columns as the session extension does: those not hidden, by `cid`, a
/// table without a primary key keyed by its rowid.
///
/// # Safety
/// `db` is an open connection, used on this thread.
unsafe fn read_table_info(db: *mut ffi::sqlite3, name: &[u8]) -> Result<TableInfo, String> {
    let name = String::from_utf8_lossy(name);
    // SAFETY: the caller's; a connection made from a handle leaves it open when dropped.
    let conn = unsafe { Connection::from_handle(db) }.map_err(|e| e.to_string())?;
    let all = table_columns::read(&conn, &name).map_err(|e| format!("cannot read the columns of table {name}: {e}"))?;
    let hook_columns = all.len() as c_int;
    let shown: Vec<ColumnInfo> = all.into_iter().filter(|column| !column.hidden).collect();
    if shown.is_empty() {
        return Err(format!("table {name} has no columns"));
    }
    let mut columns: Vec<Column> = shown.iter().map(|column| Column::At(column.cid)).collect();
    let mut primary_key: Vec<bool> = shown.iter().map(|column| column.primary_key).collect();
    let names: Vec<&str> = shown.iter().map(|column| column.name.as_str()).collect();
    let mut selected: Vec<String> = names.iter().map(|n| quoted(n)).collect();
    let mut keys: Vec<String> = names
        .iter()
        .zip(&primary_key)
        .filter(|(_, &pk)| pk)
        .map(|(n, _)| quoted(n))
        .collect();
    if !primary_key.contains(&true) {
        columns.insert(0, Column::Rowid);
        primary_key.insert(0, true);
        selected.insert(0, "_rowid_".to_owned());
        keys = vec!["_rowid_".to_owned()];
    }
    let conditions: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{k} IS ?{}", i + 1))
        .collect();
    let select = format!(
        "SELECT {} FROM main.{} WHERE {}",
        selected.join(", "),
        quoted(&name),
        conditions.join(" AND ")
    );
    Ok(TableInfo {
        columns,
        primary_key,
        hook_columns,
        select,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::types::Value;
    use rusqlite::Connection;

    /// A change as a changeset iterator reads it: table, operation, indirect, old and new
    /// values (None where the changeset leaves one undefined).
    type Change = (String, c_int, bool, Vec<Option<Value>>, Vec<Option<Value>>);

    /// The changes of `changeset`, sorted: the order of rows within a table is not part of
    /// what a changeset means.
    fn changes(changeset: &[u8]) -> Vec<Change> {
        let mut all = Vec::new();
        let mut iter = std::ptr::null_mut();
        // SAFETY: the changeset outlives the iterator, finalized below.
        unsafe {
            let code = ffi::sqlite3changeset_start(&mut iter, changeset.len() as c_int, changeset.as_ptr() as *mut _);
            assert_eq!(code, ffi::SQLITE_OK);
            while ffi::sqlite3changeset_next(iter) == ffi::SQLITE_ROW {
                let (mut table, mut columns, mut op, mut indirect) = (std::ptr::null(), 0, 0, 0);
                ffi::sqlite3changeset_op(iter, &mut table, &mut columns, &mut op, &mut indirect);
                let read = |old: bool| {
                    (0..columns)
                        .map(|i| {
                            let mut value = std::ptr::null_mut();
                            let code = if old {
                                ffi::sqlite3changeset_old(iter, i, &mut value)
                            } else {
                                ffi::sqlite3changeset_new(iter, i, &mut value)
                            };
                            (code == ffi::SQLITE_OK && !value.is_null()).then(|| owned(value))
                        })
                        .collect::<Vec<_>>()
                };
                let old = if op == ffi::SQLITE_INSERT {
                    Vec::new()
                } else {
                    read(true)
                };
                let new = if op == ffi::SQLITE_DELETE {
                    Vec::new()
                } else {
                    read(false)
                };
                let table = CStr::from_ptr(table).to_string_lossy().into_owned();
                all.push((table, op, indirect != 0, old, new));
            }
            assert_eq!(ffi::sqlite3changeset_finalize(iter), ffi::SQLITE_OK);
        }
        all.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        all
    }

    /// # Safety
    /// A live value.
    unsafe fn owned(value: *mut ffi::sqlite3_value) -> Value {
        unsafe {
            let bytes = |data: *const u8| {
                let len = ffi::sqlite3_value_bytes(value) as usize;
                if len == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(data, len).to_vec()
                }
            };
            match ffi::sqlite3_value_type(value) {
                ffi::SQLITE_INTEGER => Value::Integer(ffi::sqlite3_value_int64(value)),
                ffi::SQLITE_FLOAT => Value::Real(ffi::sqlite3_value_double(value)),
                ffi::SQLITE_TEXT => Value::Text(String::from_utf8(bytes(ffi::sqlite3_value_text(value))).unwrap()),
                ffi::SQLITE_BLOB => Value::Blob(bytes(ffi::sqlite3_value_blob(value).cast())),
                _ => Value::Null,
            }
        }
    }

    /// The session extension's changeset of `statements` run in a transaction (rolled back),
    /// with the options the engine used: every table, those without a key by rowid.
    fn session_changeset(conn: &Connection, statements: &[String]) -> Vec<u8> {
        conn.execute_batch("BEGIN").unwrap();
        let mut session = std::ptr::null_mut();
        let mut changeset = Vec::new();
        // SAFETY: the session is made, used and deleted here, on a live connection.
        unsafe {
            assert_eq!(
                ffi::sqlite3session_create(conn.handle(), c"main".as_ptr(), &mut session),
                ffi::SQLITE_OK
            );
            let mut by_rowid: c_int = 1;
            ffi::sqlite3session_object_config(
                session,
                ffi::SQLITE_SESSION_OBJCONFIG_ROWID,
                (&mut by_rowid as *mut c_int).cast(),
            );
            assert_eq!(ffi::sqlite3session_attach(session, std::ptr::null()), ffi::SQLITE_OK);
            for statement in statements {
                let _ = conn.execute_batch(statement);
            }
            let (mut len, mut bytes) = (0, std::ptr::null_mut());
            assert_eq!(
                ffi::sqlite3session_changeset(session, &mut len, &mut bytes),
                ffi::SQLITE_OK
            );
            if len > 0 {
                changeset.extend_from_slice(std::slice::from_raw_parts(bytes.cast::<u8>(), len as usize));
            }
            ffi::sqlite3_free(bytes);
            ffi::sqlite3session_delete(session);
        }
        conn.execute_batch("ROLLBACK").unwrap();
        changeset
    }

    fn captured_changeset(conn: &Connection, tables: &Arc<Mutex<Tables>>, statements: &[String]) -> Vec<u8> {
        conn.execute_batch("BEGIN").unwrap();
        let version = table_columns::schema_version(conn).unwrap();
        // SAFETY: no session is open on the connection, which outlives the capture.
        let capture = unsafe { Capture::start(conn.handle(), tables.clone(), version) };
        for statement in statements {
            let _ = conn.execute_batch(statement);
        }
        let changeset = capture.changeset(conn).unwrap();
        drop(capture);
        conn.execute_batch("ROLLBACK").unwrap();
        changeset
    }

    const SCHEMA: &str = "
        CREATE TABLE alias (k INTEGER PRIMARY KEY, a TEXT, b REAL);
        CREATE TABLE pair (x TEXT, y INTEGER, v BLOB, w INTEGER, PRIMARY KEY (x, y));
        CREATE TABLE keyless (a INTEGER, b TEXT);
        CREATE TABLE generated (k INTEGER PRIMARY KEY, v TEXT, g INTEGER AS (length(v)) STORED, h INTEGER AS (k * 2));
        CREATE TABLE counted (id INTEGER PRIMARY KEY AUTOINCREMENT, v INTEGER);
        CREATE TABLE bare (k TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID;
        CREATE TRIGGER alias_logged AFTER INSERT ON alias BEGIN INSERT INTO keyless VALUES (new.k, 'by trigger'); END;
        INSERT INTO alias VALUES (1, 'one', 1.5), (2, 'two', NULL), (3, NULL, 3.25);
        INSERT INTO pair VALUES ('a', 1, x'00ff', 10), ('a', 2, NULL, 20), ('b', 1, x'', 30);
        INSERT INTO keyless VALUES (1, 'x'), (2, 'y'), (2, 'y');
        INSERT INTO generated (k, v) VALUES (1, 'abc'), (2, NULL);
        INSERT INTO counted (v) VALUES (1), (2);
        INSERT INTO bare VALUES ('p', 1), ('q', 2);";

    /// A random statement over the schema's tables.
    fn statement(next: &mut impl FnMut(u64) -> u64) -> String {
        let value = |next: &mut dyn FnMut(u64) -> u64| match next(6) {
            0 => "NULL".to_owned(),
            1 => format!("{}", next(5) as i64 - 2),
            2 => format!("{}.5", next(4)),
            3 => format!("'t{}'", next(4)),
            4 => format!("x'{:02x}'", next(256)),
            _ => "''".to_owned(),
        };
        let key = next(5) + 1;
        match next(17) {
            0 => format!("INSERT INTO alias VALUES ({key}, {}, {})", value(next), value(next)),
            1 => format!("INSERT OR REPLACE INTO alias VALUES ({key}, {}, 2.5)", value(next)),
            2 => format!("UPDATE alias SET a = {} WHERE k = {key}", value(next)),
            3 => format!("UPDATE alias SET k = k + 10 WHERE k = {key}"),
            4 => format!("DELETE FROM alias WHERE k = {key}"),
            5 => format!(
                "INSERT OR REPLACE INTO pair VALUES ({}, {}, {}, {})",
                ["'a'", "'b'", "NULL"][next(3) as usize],
                next(3),
                value(next),
                value(next)
            ),
            6 => format!("UPDATE pair SET w = {}, y = y + {} WHERE x = 'a'", value(next), next(2)),
            7 => format!("DELETE FROM pair WHERE y = {}", next(3)),
            8 => format!("INSERT INTO keyless VALUES ({key}, {})", value(next)),
            9 => format!("UPDATE keyless SET b = {} WHERE a = {}", value(next), next(3)),
            10 => format!("DELETE FROM keyless WHERE rowid = {}", next(6)),
            11 => format!(
                "INSERT OR REPLACE INTO generated (k, v) VALUES ({key}, {})",
                value(next)
            ),
            12 => format!("UPDATE generated SET v = {} WHERE k = {key}", value(next)),
            13 => format!("INSERT INTO counted (v) VALUES ({key}); DELETE FROM counted WHERE id = {key}"),
            14 => format!(
                "INSERT OR REPLACE INTO bare VALUES ('{}', {})",
                ["p", "q", "r"][next(3) as usize],
                value(next)
            ),
            15 => format!("SAVEPOINT s; UPDATE alias SET a = 'undone' WHERE k = {key}; ROLLBACK TO s; RELEASE s"),
            _ => "DELETE FROM bare; DELETE FROM keyless".to_owned(),
        }
    }

    #[test]
    fn random_transactions_are_captured_as_the_session_extension_records_them() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let tables = Arc::new(Mutex::new(Tables::default()));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let mut nonempty = 0;
        for round in 0..1500 {
            let statements: Vec<String> = (0..1 + next(8)).map(|_| statement(&mut next)).collect();
            let expected = changes(&session_changeset(&conn, &statements));
            let captured = changes(&captured_changeset(&conn, &tables, &statements));
            assert_eq!(captured, expected, "round {round}: {statements:#?}");
            nonempty += usize::from(!expected.is_empty());
            // The state moves on between rounds.
            for statement in &statements {
                let _ = conn.execute_batch(statement);
            }
        }
        assert!(nonempty > 1000, "only {nonempty} rounds changed anything");
    }

    #[test]
    fn a_paused_capture_follows_the_rows_it_has_and_records_no_other() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        conn.execute_batch("BEGIN").unwrap();
        // SAFETY: as in `captured_changeset`.
        let mut capture = unsafe { Capture::start(conn.handle(), Default::default(), 1) };
        conn.execute_batch("UPDATE alias SET a = 'mine' WHERE k = 1").unwrap();
        capture.set_recording(false);
        conn.execute_batch("UPDATE alias SET b = 9.5 WHERE k = 1; UPDATE alias SET a = 'theirs' WHERE k = 2")
            .unwrap();
        capture.set_recording(true);
        let recorded = changes(&capture.changeset(&conn).unwrap());
        drop(capture);
        conn.execute_batch("ROLLBACK").unwrap();
        let text = |t: &str| Some(Value::Text(t.into()));
        assert_eq!(
            recorded,
            [(
                "alias".to_owned(),
                ffi::SQLITE_UPDATE,
                false,
                vec![Some(Value::Integer(1)), text("one"), Some(Value::Real(1.5))],
                vec![None, text("mine"), Some(Value::Real(9.5))]
            )]
        );
    }

    #[test]
    fn varints_are_sqlites() {
        for (value, bytes) in [
            (0u64, &[0u8][..]),
            (127, &[0x7f]),
            (128, &[0x81, 0x00]),
            (16_383, &[0xff, 0x7f]),
            (16_384, &[0x81, 0x80, 0x00]),
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out, bytes, "{value}");
            assert_eq!(get_varint(&out), (value, bytes.len()));
        }
    }
}
