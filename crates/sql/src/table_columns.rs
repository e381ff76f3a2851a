//! What SQLite says of a table's columns and of the schema's version: the one place the
//! write-set capture, the write-set applier and the labeller read them from.

use rusqlite::Connection;

/// One column of a table, as `pragma_table_xinfo` describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ColumnInfo {
    /// Its index among all the table's columns, hidden ones counted (what the pre-update
    /// hook indexes values by).
    pub cid: i32,
    pub name: String,
    /// Part of the declared primary key.
    pub primary_key: bool,
    /// Hidden (a virtual table's hidden column) or generated: it takes no value from an
    /// INSERT, and changesets leave it out.
    pub hidden: bool,
}

/// The columns of `table` on `conn`, in `cid` order, hidden ones included; empty if there is
/// no such table.
pub(crate) fn read(conn: &Connection, table: &str) -> rusqlite::Result<Vec<ColumnInfo>> {
    // Read on a schema change only: not kept prepared.
    let mut statement = conn.prepare("SELECT cid, name, pk, hidden FROM pragma_table_xinfo(?1) ORDER BY cid")?;
    let rows = statement.query_map([table], |row| {
        Ok(ColumnInfo {
            cid: row.get(0)?,
            name: row.get(1)?,
            primary_key: row.get::<_, i64>(2)? != 0,
            hidden: row.get::<_, i64>(3)? != 0,
        })
    })?;
    rows.collect()
}

/// A number that changes whenever the schema does (`PRAGMA schema_version`).
pub(crate) fn schema_version(conn: &Connection) -> rusqlite::Result<u64> {
    conn.prepare_cached("PRAGMA schema_version")?
        .query_row([], |row| row.get::<_, i64>(0))
        .map(|version| version as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_read_in_order_with_keys_and_generated_ones_marked() {
        let conn = Connection::open_in_memory().unwrap();
        let before = schema_version(&conn).unwrap();
        conn.execute_batch("CREATE TABLE t (b TEXT, a INTEGER, g INTEGER AS (a * 2), c BLOB, PRIMARY KEY (a, b))")
            .unwrap();
        assert_ne!(
            schema_version(&conn).unwrap(),
            before,
            "a CREATE TABLE moves the version"
        );
        let columns = read(&conn, "T").unwrap();
        let described: Vec<(i32, &str, bool, bool)> = columns
            .iter()
            .map(|c| (c.cid, c.name.as_str(), c.primary_key, c.hidden))
            .collect();
        assert_eq!(
            described,
            vec![
                (0, "b", true, false),
                (1, "a", true, false),
                (2, "g", false, true),
                (3, "c", false, false)
            ]
        );
        assert!(read(&conn, "absent").unwrap().is_empty());
    }
}
