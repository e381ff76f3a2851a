//! Applying a write-set (SQLite's changeset format, as the session extension records it) row by
//! row, with statements kept prepared. `sqlite3changeset_apply` prepares its statements afresh
//! for every write-set — for TPC-C that cost a replica more than re-executing the transaction.
//!
//! Every change must find its row as the leader left it: an insert must not collide, a delete
//! must match the whole old row, an update the key and the old values of what it changes.
//! Anything else means the replicas differ, and is an error.

use std::collections::HashMap;
use std::ffi::{c_int, c_uchar, CStr};

use rusqlite::{ffi, Connection};

use crate::engine::sqlite_code_error;
use crate::error::SqlError;
use crate::txn::Value;

/// The columns of the tables write-sets touch, by table, as of one schema version.
#[derive(Default)]
pub struct Tables {
    schema_version: Option<i64>,
    columns: HashMap<String, Vec<String>>,
}

impl Tables {
    /// The column names of `table` as a write-set orders them (a table without a primary key
    /// is recorded with its rowid first).
    fn columns(&mut self, conn: &Connection, table: &str, count: usize) -> Result<&[String], SqlError> {
        if !self.columns.contains_key(table) {
            let mut statement = conn
                .prepare("SELECT name, pk FROM pragma_table_info(?1) ORDER BY cid")
                .map_err(|e| SqlError::from_sqlite(&e))?;
            let info = statement
                .query_map([table], |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| SqlError::from_sqlite(&e))?;
            let mut names: Vec<String> = Vec::with_capacity(info.len() + 1);
            if info.iter().all(|(_, pk)| *pk == 0) {
                names.push("_rowid_".to_owned());
            }
            names.extend(info.into_iter().map(|(name, _)| name));
            self.columns.insert(table.to_owned(), names);
        }
        let names = &self.columns[table];
        if names.len() != count {
            return Err(diverged(format!(
                "a write-set has {count} columns for table {table}, which has {}",
                names.len()
            )));
        }
        Ok(names)
    }

    /// Forgets what it knows if the schema changed since it learned it.
    fn refresh(&mut self, conn: &Connection) -> Result<(), SqlError> {
        let version = conn
            .prepare_cached("PRAGMA schema_version")
            .and_then(|mut statement| statement.query_row([], |row| row.get::<_, i64>(0)))
            .map_err(|e| SqlError::from_sqlite(&e))?;
        if self.schema_version != Some(version) {
            self.columns.clear();
            self.schema_version = Some(version);
        }
        Ok(())
    }
}

/// The SQLSTATE of a change whose row does not stand as the write-set expects.
pub(crate) const ROW_MISMATCH: &str = "XX001";

fn diverged(message: String) -> SqlError {
    SqlError::new(ROW_MISMATCH, message)
}

/// Walks a changeset; finalized on drop.
struct Changes(*mut ffi::sqlite3_changeset_iter);

impl Drop for Changes {
    fn drop(&mut self) {
        // SAFETY: the iterator came from `sqlite3changeset_start` and is finalized once.
        unsafe { ffi::sqlite3changeset_finalize(self.0) };
    }
}

/// The value a changeset holds, or None where it holds none (an update's unchanged column).
///
/// SAFETY: `value` is null or a value the changeset iterator gave, still current.
unsafe fn value_of(value: *mut ffi::sqlite3_value) -> Option<Value> {
    if value.is_null() {
        return None;
    }
    let bytes = |data: *const u8| {
        let len = ffi::sqlite3_value_bytes(value) as usize;
        if data.is_null() || len == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(data, len).to_vec()
        }
    };
    Some(match ffi::sqlite3_value_type(value) {
        ffi::SQLITE_INTEGER => Value::Integer(ffi::sqlite3_value_int64(value)),
        ffi::SQLITE_FLOAT => Value::Real(ffi::sqlite3_value_double(value)),
        ffi::SQLITE_TEXT => Value::Text(String::from_utf8_lossy(&bytes(ffi::sqlite3_value_text(value))).into_owned()),
        ffi::SQLITE_BLOB => Value::Blob(bytes(ffi::sqlite3_value_blob(value).cast())),
        _ => Value::Null,
    })
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Applies `write_set` on `conn`, inside its open transaction. With `fresh_rowids`, a row
/// inserted into a table without a primary key takes the next rowid here rather than the one
/// it was recorded with (hybrid replication: nodes executing at once draw the same rowids, and
/// every node applying the write-sets in log order draws alike).
pub fn apply(conn: &Connection, tables: &mut Tables, write_set: &[u8], fresh_rowids: bool) -> Result<(), SqlError> {
    tables.refresh(conn)?;
    let len = c_int::try_from(write_set.len()).map_err(|_| SqlError::new("54000", "a write-set over 2 GiB"))?;
    let mut iter = std::ptr::null_mut();
    // SAFETY: SQLite only reads the `len` bytes (the iterator borrows them, and is finalized
    // before `write_set` goes), whatever they hold.
    let started = unsafe { ffi::sqlite3changeset_start(&mut iter, len, write_set.as_ptr().cast_mut().cast()) };
    if started != ffi::SQLITE_OK {
        return Err(sqlite_code_error("a write-set that does not parse", started));
    }
    let changes = Changes(iter);
    loop {
        // SAFETY: the iterator is live.
        match unsafe { ffi::sqlite3changeset_next(changes.0) } {
            ffi::SQLITE_ROW => {}
            ffi::SQLITE_DONE => break,
            code => return Err(sqlite_code_error("a write-set that does not parse", code)),
        }
        let mut table: *const std::ffi::c_char = std::ptr::null();
        let (mut count, mut op, mut indirect): (c_int, c_int, c_int) = (0, 0, 0);
        let mut pk: *mut c_uchar = std::ptr::null_mut();
        // SAFETY: the iterator stands on a change; the outputs live until the next step.
        let (table, pk) = unsafe {
            let read = ffi::sqlite3changeset_op(changes.0, &mut table, &mut count, &mut op, &mut indirect);
            let keyed = ffi::sqlite3changeset_pk(changes.0, &mut pk, &mut count);
            if read != ffi::SQLITE_OK || keyed != ffi::SQLITE_OK || table.is_null() || pk.is_null() || count <= 0 {
                return Err(sqlite_code_error(
                    "a write-set that does not parse",
                    ffi::SQLITE_CORRUPT,
                ));
            }
            (
                CStr::from_ptr(table).to_string_lossy().into_owned(),
                std::slice::from_raw_parts(pk, count as usize).to_vec(),
            )
        };
        let count = count as usize;
        let values = |which: unsafe extern "C" fn(
            *mut ffi::sqlite3_changeset_iter,
            c_int,
            *mut *mut ffi::sqlite3_value,
        ) -> c_int| {
            (0..count)
                .map(|i| {
                    let mut value = std::ptr::null_mut();
                    // SAFETY: the iterator stands on this change; `i` is below its column count.
                    unsafe {
                        which(changes.0, i as c_int, &mut value);
                        value_of(value)
                    }
                })
                .collect::<Vec<_>>()
        };
        let names = tables.columns(conn, &table, count)?;
        let (sql, params) = match op {
            ffi::SQLITE_INSERT => {
                let skipped = usize::from(fresh_rowids && names[0] == "_rowid_");
                let new = values(ffi::sqlite3changeset_new);
                let params: Vec<Value> = new
                    .into_iter()
                    .skip(skipped)
                    .map(|v| v.unwrap_or(Value::Null))
                    .collect();
                let columns: Vec<String> = names[skipped..].iter().map(|n| quoted(n)).collect();
                let slots: Vec<String> = (1..=params.len()).map(|i| format!("?{i}")).collect();
                (
                    format!(
                        "INSERT INTO {} ({}) VALUES ({})",
                        quoted(&table),
                        columns.join(", "),
                        slots.join(", ")
                    ),
                    params,
                )
            }
            ffi::SQLITE_DELETE => {
                let old = values(ffi::sqlite3changeset_old);
                let mut params = Vec::with_capacity(count);
                let mut conditions = Vec::with_capacity(count);
                for (name, value) in names.iter().zip(old) {
                    params.push(value.unwrap_or(Value::Null));
                    conditions.push(format!("{} IS ?{}", quoted(name), params.len()));
                }
                (
                    format!("DELETE FROM {} WHERE {}", quoted(&table), conditions.join(" AND ")),
                    params,
                )
            }
            ffi::SQLITE_UPDATE => {
                let (old, new) = (values(ffi::sqlite3changeset_old), values(ffi::sqlite3changeset_new));
                let mut params = Vec::with_capacity(2 * count);
                let mut assignments = Vec::new();
                let mut conditions = Vec::new();
                for (((name, new), old), &key) in names.iter().zip(new).zip(old).zip(&pk) {
                    let changed = new.is_some();
                    if let Some(value) = new {
                        params.push(value);
                        assignments.push(format!("{} = ?{}", quoted(name), params.len()));
                    }
                    if key != 0 || changed {
                        params.push(old.unwrap_or(Value::Null));
                        conditions.push(format!("{} IS ?{}", quoted(name), params.len()));
                    }
                }
                if assignments.is_empty() {
                    continue;
                }
                (
                    format!(
                        "UPDATE {} SET {} WHERE {}",
                        quoted(&table),
                        assignments.join(", "),
                        conditions.join(" AND ")
                    ),
                    params,
                )
            }
            other => return Err(diverged(format!("a write-set change of unknown kind {other}"))),
        };
        let changed = conn
            .prepare_cached(&sql)
            .and_then(|mut statement| statement.execute(rusqlite::params_from_iter(&params)))
            .map_err(|e| SqlError::from_sqlite(&e))?;
        if changed != 1 {
            return Err(diverged(format!(
                "a write-set row of table {table} does not stand as the leader left it ({sql})"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::engine::{AppliedMark, Engine, Recorded, Sqlite};
    use crate::txn::{TxnId, Value};

    fn engine(dir: &std::path::Path, rows: &str) -> Sqlite {
        let mut engine = Sqlite::open(dir).unwrap();
        engine
            .execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT, n REAL)", &[])
            .unwrap();
        engine.execute(&format!("INSERT INTO t VALUES {rows}"), &[]).unwrap();
        engine
    }

    fn rows(engine: &mut Sqlite) -> Vec<Vec<Value>> {
        engine.execute("SELECT * FROM t ORDER BY k", &[]).unwrap().rows
    }

    #[test]
    fn a_change_whose_row_differs_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut leader = engine(&dir.path().join("leader"), "(1, 'a', 1.5), (2, 'b', 2.5)");
        leader.begin().unwrap();
        leader.record_writes().unwrap();
        for sql in [
            "UPDATE t SET n = n * 2 WHERE k = 1",
            "DELETE FROM t WHERE k = 2",
            "INSERT INTO t VALUES (3, 'c', NULL)",
        ] {
            leader.execute(sql, &[]).unwrap();
        }
        let Recorded::WriteSet(write_set) = leader.commit_recorded(TxnId { incarnation: 1, seq: 1 }).unwrap() else {
            panic!("the transaction changed rows");
        };
        let mark = AppliedMark {
            log_index: 5,
            ..AppliedMark::default()
        };

        let mut same = engine(&dir.path().join("same"), "(1, 'a', 1.5), (2, 'b', 2.5)");
        same.apply_write_set(&write_set).unwrap();
        same.end_write_sets(Some(mark)).unwrap();
        assert_eq!(rows(&mut same), rows(&mut leader));
        assert_eq!(same.applied().unwrap(), mark);

        for (name, differing) in [
            ("updated", "(1, 'a', 9.5), (2, 'b', 2.5)"),
            ("deleted", "(1, 'a', 1.5), (2, 'x', 2.5)"),
            ("inserted", "(1, 'a', 1.5), (2, 'b', 2.5), (3, 'c', NULL)"),
        ] {
            let mut replica = engine(&dir.path().join(name), differing);
            let before = rows(&mut replica);
            let error = replica.apply_write_set(&write_set).unwrap_err();
            replica.end_write_sets(None).unwrap();
            assert!(error.code == "XX001" || error.code == "23505", "{name}: {error}");
            assert_eq!(rows(&mut replica), before, "{name}");
            assert_eq!(replica.applied().unwrap(), AppliedMark::default(), "{name}");
        }
    }
}
