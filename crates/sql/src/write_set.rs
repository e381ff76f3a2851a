//! Applying a write-set (SQLite's changeset format, as `capture` writes it) row by
//! row, with statements kept prepared. `sqlite3changeset_apply` prepares its statements afresh
//! for every write-set — for TPC-C that cost a replica more than re-executing the transaction.
//!
//! Every change must find its row as the leader left it: an insert must not collide, a delete
//! must match the whole old row, an update the key and the old values of what it changes.
//! Anything else means the replicas differ, and is an error.

use std::collections::HashMap;
use std::ffi::{c_int, c_uchar, CStr};

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{ffi, Connection};

use crate::engine::sqlite_code_error;
use crate::error::SqlError;
use crate::table_columns::{self, ColumnInfo};

/// What applying write-sets needs to know of the tables they touch, as of one schema version:
/// their columns, and the statement text for each shape of change met so far (built once, not
/// per row: formatting it per row cost more than SQLite's execution of some changes).
#[derive(Default)]
pub struct Tables {
    schema_version: Option<u64>,
    tables: HashMap<String, Table>,
}

struct Table {
    /// Column names as a write-set orders them (a table without a primary key is recorded
    /// with its rowid first, as `_rowid_`).
    columns: Vec<String>,
    statements: HashMap<Shape, String>,
}

/// A change's statement text depends on its kind and, for an update, on which columns it sets
/// and which it matches on.
#[derive(Hash, PartialEq, Eq)]
enum Shape {
    Insert {
        skip_rowid: bool,
    },
    Delete,
    /// Per column: bit 0 set if the update sets it, bit 1 if it is part of the key.
    Update(Vec<u8>),
}

impl Tables {
    /// `table`, checked to have `count` columns.
    fn table(&mut self, conn: &Connection, name: &str, count: usize) -> Result<&mut Table, SqlError> {
        if !self.tables.contains_key(name) {
            let info: Vec<ColumnInfo> = table_columns::read(conn, name)
                .map_err(|e| SqlError::from_sqlite(&e))?
                .into_iter()
                .filter(|column| !column.hidden)
                .collect();
            let mut columns: Vec<String> = Vec::with_capacity(info.len() + 1);
            if !info.iter().any(|column| column.primary_key) {
                columns.push("_rowid_".to_owned());
            }
            columns.extend(info.into_iter().map(|column| column.name));
            self.tables.insert(
                name.to_owned(),
                Table {
                    columns,
                    statements: HashMap::new(),
                },
            );
        }
        let table = self.tables.get_mut(name).expect("inserted above");
        if table.columns.len() != count {
            return Err(diverged(format!(
                "a write-set has {count} columns for table {name}, which has {}",
                table.columns.len()
            )));
        }
        Ok(table)
    }

    /// Forgets what it knows if the schema changed since it learned it.
    fn refresh(&mut self, conn: &Connection) -> Result<(), SqlError> {
        let version = table_columns::schema_version(conn).map_err(|e| SqlError::from_sqlite(&e))?;
        if self.schema_version != Some(version) {
            self.tables.clear();
            self.schema_version = Some(version);
        }
        Ok(())
    }
}

impl Table {
    /// The statement text for a change of `shape` to table `name`: parameters numbered in
    /// column order, an update's new value of a column before its old one.
    fn statement(&mut self, name: &str, shape: Shape) -> &str {
        let columns = &self.columns;
        self.statements.entry(shape).or_insert_with_key(|shape| {
            let mut slot = 0;
            let mut next = || {
                slot += 1;
                slot
            };
            match shape {
                Shape::Insert { skip_rowid } => {
                    let columns = &columns[usize::from(*skip_rowid)..];
                    let names: Vec<String> = columns.iter().map(|c| quoted(c)).collect();
                    let slots: Vec<String> = columns.iter().map(|_| format!("?{}", next())).collect();
                    format!(
                        "INSERT INTO {} ({}) VALUES ({})",
                        quoted(name),
                        names.join(", "),
                        slots.join(", ")
                    )
                }
                Shape::Delete => {
                    let conditions: Vec<String> = columns
                        .iter()
                        .map(|c| format!("{} IS ?{}", quoted(c), next()))
                        .collect();
                    format!("DELETE FROM {} WHERE {}", quoted(name), conditions.join(" AND "))
                }
                Shape::Update(flags) => {
                    let mut assignments = Vec::new();
                    let mut conditions = Vec::new();
                    for (column, flag) in columns.iter().zip(flags) {
                        let (sets, key) = (flag & 1 != 0, flag & 2 != 0);
                        if sets {
                            assignments.push(format!("{} = ?{}", quoted(column), next()));
                        }
                        if key || sets {
                            conditions.push(format!("{} IS ?{}", quoted(column), next()));
                        }
                    }
                    format!(
                        "UPDATE {} SET {} WHERE {}",
                        quoted(name),
                        assignments.join(", "),
                        conditions.join(" AND ")
                    )
                }
            }
        })
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

/// The value a changeset (or the pre-update hook) holds, or None where it holds none (an
/// update's unchanged column).
///
/// SAFETY: `value` is null or a value the changeset iterator (or the hook) gave; the result
/// borrows it, and must not outlive the iterator's current change (or the hook's call).
pub(crate) unsafe fn value_of<'a>(value: *mut ffi::sqlite3_value) -> Option<ValueRef<'a>> {
    if value.is_null() {
        return None;
    }
    let bytes = |data: *const u8| {
        let len = ffi::sqlite3_value_bytes(value) as usize;
        if data.is_null() || len == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(data, len)
        }
    };
    Some(match ffi::sqlite3_value_type(value) {
        ffi::SQLITE_INTEGER => ValueRef::Integer(ffi::sqlite3_value_int64(value)),
        ffi::SQLITE_FLOAT => ValueRef::Real(ffi::sqlite3_value_double(value)),
        ffi::SQLITE_TEXT => ValueRef::Text(bytes(ffi::sqlite3_value_text(value))),
        ffi::SQLITE_BLOB => ValueRef::Blob(bytes(ffi::sqlite3_value_blob(value).cast())),
        _ => ValueRef::Null,
    })
}

/// `name` quoted for SQL.
pub(crate) fn quoted(name: &str) -> String {
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
        // SAFETY: the iterator stands on a change; the outputs live until the next step, and
        // are not used after it.
        let (name, pk) = unsafe {
            let read = ffi::sqlite3changeset_op(changes.0, &mut table, &mut count, &mut op, &mut indirect);
            let keyed = ffi::sqlite3changeset_pk(changes.0, &mut pk, &mut count);
            if read != ffi::SQLITE_OK || keyed != ffi::SQLITE_OK || table.is_null() || pk.is_null() || count <= 0 {
                return Err(sqlite_code_error(
                    "a write-set that does not parse",
                    ffi::SQLITE_CORRUPT,
                ));
            }
            (CStr::from_ptr(table), std::slice::from_raw_parts(pk, count as usize))
        };
        let name = name
            .to_str()
            .map_err(|_| diverged("a write-set names a table that is not UTF-8".to_owned()))?;
        let count = count as usize;
        let values = |which: unsafe extern "C" fn(
            *mut ffi::sqlite3_changeset_iter,
            c_int,
            *mut *mut ffi::sqlite3_value,
        ) -> c_int| {
            (0..count)
                .map(|i| {
                    let mut value = std::ptr::null_mut();
                    // SAFETY: the iterator stands on this change; `i` is below its column
                    // count; the values are bound and executed before the next step.
                    unsafe {
                        which(changes.0, i as c_int, &mut value);
                        value_of(value)
                    }
                })
                .collect::<Vec<_>>()
        };
        let table = tables.table(conn, name, count)?;
        let mut params: Vec<ValueRef<'_>> = Vec::with_capacity(2 * count);
        let shape = match op {
            ffi::SQLITE_INSERT => {
                let skip_rowid = fresh_rowids && table.columns[0] == "_rowid_";
                let new = values(ffi::sqlite3changeset_new);
                params.extend(
                    new.into_iter()
                        .skip(usize::from(skip_rowid))
                        .map(|v| v.unwrap_or(ValueRef::Null)),
                );
                Shape::Insert { skip_rowid }
            }
            ffi::SQLITE_DELETE => {
                let old = values(ffi::sqlite3changeset_old);
                params.extend(old.into_iter().map(|v| v.unwrap_or(ValueRef::Null)));
                Shape::Delete
            }
            ffi::SQLITE_UPDATE => {
                let (old, new) = (values(ffi::sqlite3changeset_old), values(ffi::sqlite3changeset_new));
                let mut flags = Vec::with_capacity(count);
                for ((new, old), &key) in new.into_iter().zip(old).zip(pk) {
                    let sets = new.is_some();
                    if let Some(value) = new {
                        params.push(value);
                    }
                    if key != 0 || sets {
                        params.push(old.unwrap_or(ValueRef::Null));
                    }
                    flags.push(u8::from(sets) | (u8::from(key != 0) << 1));
                }
                if flags.iter().all(|flag| flag & 1 == 0) {
                    continue;
                }
                Shape::Update(flags)
            }
            other => return Err(diverged(format!("a write-set change of unknown kind {other}"))),
        };
        let sql = table.statement(name, shape);
        let changed = conn
            .prepare_cached(sql)
            .and_then(|mut statement| {
                for (slot, value) in params.iter().enumerate() {
                    statement.raw_bind_parameter(slot + 1, ToSqlOutput::Borrowed(*value))?;
                }
                statement.raw_execute()
            })
            .map_err(|e| SqlError::from_sqlite(&e))?;
        if changed != 1 {
            return Err(diverged(format!(
                "a write-set row of table {name} does not stand as the leader left it ({sql})"
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
