//! The page cache that hands SQLite's swap page number to pcache1 as 0 (`page_cache`) keeps
//! every row and a sound database through splits, merges, rollbacks and evictions. Its own
//! process: SQLite takes a page cache only before its first connection.

use std::collections::BTreeMap;

use chorus_sql::page_cache;
use rusqlite::{params, Connection};

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn swapped_pages_keep_every_row_and_a_sound_database() {
    page_cache::install();
    assert!(page_cache::installed(), "the first thing this process does with SQLite");
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Connection::open(dir.path().join("db")).unwrap();
    // A small cache, so that pages are evicted and fetched again under the swaps.
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA cache_size = 200;
         CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL);
         CREATE INDEX t_v ON t (v);",
    )
    .unwrap();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut model: BTreeMap<i64, Vec<u8>> = BTreeMap::new();
    for round in 0..300 {
        let txn = conn.transaction().unwrap();
        let mut changed = model.clone();
        for _ in 0..200 {
            let k = (rng.next() % 20_000) as i64;
            if rng.next().is_multiple_of(4) {
                txn.execute("DELETE FROM t WHERE k >= ?1 AND k < ?1 + 40", params![k])
                    .unwrap();
                let doomed: Vec<i64> = changed.range(k..k + 40).map(|(&k, _)| k).collect();
                for k in doomed {
                    changed.remove(&k);
                }
            } else {
                let v: Vec<u8> = (0..(50 + rng.next() % 300)).map(|_| rng.next() as u8).collect();
                txn.execute("INSERT OR REPLACE INTO t VALUES (?1, ?2)", params![k, v])
                    .unwrap();
                changed.insert(k, v);
            }
        }
        if round % 5 == 4 {
            txn.rollback().unwrap();
        } else {
            txn.commit().unwrap();
            model = changed;
        }
    }
    assert!(
        page_cache::swaps() > 0,
        "the workload swapped no pages: it tests nothing"
    );
    let integrity: String = conn.query_row("PRAGMA integrity_check", (), |row| row.get(0)).unwrap();
    assert_eq!(integrity, "ok");
    let mut rows = conn.prepare("SELECT k, v FROM t ORDER BY k").unwrap();
    let stored: BTreeMap<i64, Vec<u8>> = rows
        .query_map((), |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(stored.len(), model.len());
    assert!(stored == model, "the rows differ from what was committed");
}
